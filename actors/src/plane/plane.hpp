#pragma once
// Moved to dopt/actors/internal/group_plane.hpp (gpu/ implements planes too).
#include "dopt/actors/internal/group_plane.hpp"
