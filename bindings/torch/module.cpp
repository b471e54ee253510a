// Python module meshrt._torch_backend: creates the "meshrt" c10d backend (meshrt/torch.py
// registers it with torch.distributed).
#include <torch/csrc/utils/pybind.h>
#include <torch/python.h>

#include "backend.h"
#include "backend_cuda.h"

namespace py = pybind11;

PYBIND11_MODULE(_torch_backend, m) {
  m.doc() = "meshrt's torch.distributed backend (import meshrt.torch to register it)";
  py::module::import("torch.distributed");  // c10d's Backend and Store types
  py::class_<meshrt_torch::MeshrtBackend, c10d::Backend,
             c10::intrusive_ptr<meshrt_torch::MeshrtBackend>>(m, "MeshrtBackend")
      .def_property_readonly("comm_handle",
                             [](const meshrt_torch::MeshrtBackend& b) {
                               return reinterpret_cast<uintptr_t>(b.comm());
                             })
      // The meshrt collective backend the CPU tensors run on (meshrt_comm_backend).
      .def_property_readonly("collective_backend", [](const meshrt_torch::MeshrtBackend& b) {
        const char* name = nullptr;
        if (meshrt_comm_backend(b.comm(), &name) != MESHRT_SUCCESS)
          throw std::runtime_error(std::string("meshrt: ") + meshrt_last_error());
        return std::string(name);
      });
  m.def("cuda_built", &meshrt_torch::cuda_built,
        "whether this module moves CUDA tensors (torch and meshrt both built with CUDA)");
  m.def(
      "create_backend",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, double timeout_s) {
        return meshrt_torch::MeshrtBackend::create(store, rank, size, timeout_s);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout_s"),
      py::call_guard<py::gil_scoped_release>());
}
