// `meshrt info`: devices, why CUDA is unavailable, library versions and build options.
#pragma once

#include <ostream>

namespace meshrt::cli {

int run_info(std::ostream& os);

}  // namespace meshrt::cli
