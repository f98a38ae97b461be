#pragma once
// Moved to dopt/actors/internal/op.hpp (gpu/ implements planes too).
#include "dopt/actors/internal/op.hpp"
