// The model of a config's arch.
#include "model/gpt.hpp"
#include "model/llama.hpp"

namespace pptrain {

std::unique_ptr<Model> make_model(const ModelConfig& config, int batch, ops::Ops& ops,
                                  const ModelPartition& part, comm::Group* tp,
                                  const ActivationPolicy& policy, Model::Master master,
                                  const ContextRing& ring) {
  if (config.arch == Arch::Llama)
    return std::make_unique<LlamaModel>(config, batch, ops, part, tp, policy, master, ring);
  return std::make_unique<GptModel>(config, batch, ops, part, tp, policy, master, ring);
}

}  // namespace pptrain
