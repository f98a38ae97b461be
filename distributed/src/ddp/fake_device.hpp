#pragma once
// Moved to tests/support/fake_ddp_device.hpp (namespace dopt::testing); this
// name stays for the ZeRO device test until it includes the new one.
#include "fake_ddp_device.hpp"
#include "legacy_names.hpp"
