// The CUDA emulator's stand-in for the toolkit header (see ../emulator_wmma.hpp).
#pragma once
#include "emulator_wmma.hpp"
