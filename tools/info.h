// `meshrt info`: devices, why CUDA is unavailable, library versions and build options.
#pragma once

#include <map>
#include <ostream>
#include <string>

namespace meshrt::cli {

int run_info(std::ostream& os);

// The same facts as key -> value (meshrt, build type, compiler, cuda build, cuda runtime,
// blas, blas threading, mpi), for benchmark JSON files.
std::map<std::string, std::string> version_info();

}  // namespace meshrt::cli
