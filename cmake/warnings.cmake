# Shared compile options for every pptrain target (an INTERFACE target, linked PRIVATE).
add_library(pptrain_warnings INTERFACE)
target_compile_options(pptrain_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-unused-parameter>)
# nvcc passes host warnings on to the host compiler (not -Wpedantic: CUDA's headers
# and launch syntax are not ISO C++).
target_compile_options(pptrain_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter --expt-relaxed-constexpr>)
