#pragma once
// Former name of reference_data.hpp + bitwise_checks.hpp + optimizer_contract.hpp, for the
// ZeRO tests (distributed/src/zero/) that still include it. Remove once they do not.
#include "bitwise_checks.hpp"
#include "legacy_names.hpp"
#include "optimizer_contract.hpp"
#include "reference_data.hpp"
