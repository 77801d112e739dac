// The CUDA emulator's stand-in for the toolkit header (see ../cuda_emulator.hpp).
#pragma once
#include "cuda_emulator.hpp"
