// When a rank may wait for a send it left to complete in the background
// (MessageMode::AsyncSends) without any chance of deadlock, whatever the ranks' timing:
// the point from which the executor reuses the activation set the send reads, and the
// memory plan stops counting it.
#pragma once
#include <cstddef>
#include <vector>

#include "pipeline/schedule.hpp"

namespace pptrain {

// For every stage s and step i of steps[s]: the first of s's own steps at whose start s
// may block until the sends posted in step i have completed, i + 1 for a step that posts
// none in the background (a blocking batch completes its sends itself). A send
// completes once its receiver has posted the batch that receives it (the strictest
// semantics, the simulator's); waiting for it at step k cannot deadlock when the
// receiver reaches that batch needing nothing s does from step k on: the steps of s it
// depends on, through any chain of messages, are all before k. The chains are followed
// as vector clocks over all stages' steps, with messages matched by name as the
// simulator matches them. std::logic_error if the steps cannot complete (the simulator
// reports why).
std::vector<std::vector<std::size_t>> sends_waitable_from(const std::vector<std::vector<Step>>& steps,
                                                          const Placement& placement);

}  // namespace pptrain
