// The eager autograd node of a neuron with a threshold (ST-BIF, the QANN quantizer), in C++.
//
// Forward is one compiled Triton kernel, backward another; both were compiled (and first launched) by the
// Python path, which hands their CUfunction and fixed arguments over as a Spec. This spares the host time a
// Python autograd.Function costs per layer (benchmarks/RESULTS.md). Launches go through the
// driver (cuLaunchKernel from libcuda.so.1, as Triton's launcher does) with the same argument buffer Triton's
// launcher builds: every non-constexpr argument in order, then its two scratch pointers (null: kernels with
// scratch are not handed over). Whatever a Spec cannot launch exactly as the Python path would (a gradient of
// other strides, an unaligned pointer, a backward variant not compiled yet) goes to the Python path.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/utils/pybind.h>

namespace py = pybind11;
using at::Tensor;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// The driver entry points, by dlsym: no CUDA headers or toolkit needed to build this file.
using CUresult = int;
using LaunchKernel = CUresult (*)(void* function, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                                  unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared_bytes,
                                  void* stream, void** params, void** extra);
using StreamIsCapturing = CUresult (*)(void* stream, int* status);
using GetErrorString = CUresult (*)(CUresult error, const char** text);

struct Driver {
  LaunchKernel launch_kernel = nullptr;
  StreamIsCapturing stream_is_capturing = nullptr;
  GetErrorString get_error_string = nullptr;
};

const Driver& driver() {
  static const Driver loaded = [] {
    void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    TORCH_CHECK(library != nullptr, "threshold_node: cannot load libcuda.so.1: ", dlerror());
    Driver d;
    d.launch_kernel = reinterpret_cast<LaunchKernel>(dlsym(library, "cuLaunchKernel"));
    d.stream_is_capturing = reinterpret_cast<StreamIsCapturing>(dlsym(library, "cuStreamIsCapturing"));
    d.get_error_string = reinterpret_cast<GetErrorString>(dlsym(library, "cuGetErrorString"));
    TORCH_CHECK(d.launch_kernel && d.stream_is_capturing && d.get_error_string,
                "threshold_node: libcuda.so.1 lacks cuLaunchKernel, cuStreamIsCapturing or cuGetErrorString");
    return d;
  }();
  return loaded;
}

// Pointers an argument may take per call, by role.
enum Role : int { kFixed = -1, kX = 0, kOut = 1, kTheta = 2, kGradOut = 3, kGradX = 4, kPartials = 5,
                  kCounter = 6, kGradTheta = 7, kNumRoles = 8 };
constexpr int kMaxParams = 64;

// One compiled kernel: its function, launch shape and arguments; each argument a fixed value or a role.
struct Kernel {
  void* function = nullptr;
  unsigned grid = 0, threads = 0, shared_bytes = 0;
  std::vector<int> roles;          // per non-constexpr argument
  std::vector<uint64_t> values;    // its value where fixed, as 64 bits (little-endian: a narrower type reads the low bytes)

  // The argument slots of a launch: each argument, then the two scratch pointers (none).
  size_t pack(const uint64_t (&pointers)[kNumRoles], uint64_t* arguments) const {
    const size_t n = roles.size();
    for (size_t i = 0; i < n; ++i) {
      arguments[i] = roles[i] == kFixed ? values[i] : pointers[roles[i]];
    }
    arguments[n] = arguments[n + 1] = 0;
    return n + 2;
  }

  void launch(const uint64_t (&pointers)[kNumRoles], void* stream) const {
    uint64_t arguments[kMaxParams + 2];
    void* params[kMaxParams + 2];
    const size_t count = pack(pointers, arguments);
    for (size_t i = 0; i < count; ++i) params[i] = &arguments[i];
    CUresult status = driver().launch_kernel(function, grid, 1, 1, threads, 1, 1, shared_bytes, stream, params,
                                             nullptr);
    if (status != 0) {
      const char* text = nullptr;
      driver().get_error_string(status, &text);
      TORCH_CHECK(false, "threshold_node: cuLaunchKernel failed: ", text ? text : "unknown error");
    }
  }
};

// What one Plan (one kind of input) launches with. Kernels are set once, before their flag.
struct Spec {
  c10::Device device{c10::DeviceType::CUDA, 0};
  at::ScalarType x_dtype = at::kFloat, theta_dtype = at::kFloat;
  std::vector<int64_t> x_sizes, x_strides, theta_sizes;
  int64_t backward_programs = 0;
  Kernel forward;
  Kernel backward[2];                  // [without, with] the threshold's gradient
  std::atomic<bool> has_backward[2] = {false, false};
  py::object python_backward;          // (grad_out, x, theta, grad_threshold) -> (grad_x, grad_theta | None)
};

// Specs live as long as the process (an index is all a node keeps): the Python side makes one per Plan.
std::mutex specs_mutex;
std::vector<Spec*> specs;

Spec* spec_at(int64_t index) {
  std::lock_guard<std::mutex> lock(specs_mutex);
  TORCH_CHECK(index >= 0 && index < static_cast<int64_t>(specs.size()), "threshold_node: no spec ", index);
  return specs[index];
}

uint64_t address(const Tensor& t) { return reinterpret_cast<uint64_t>(t.data_ptr()); }
bool aligned(const Tensor& t) { return address(t) % 16 == 0; }  // Triton's pointer specialization

// Whether the spec's kernels take these inputs as they are: the kind of input they were compiled for (x of
// one shape, strides and dtype, a threshold of one shape and dtype, one device), and aligned.
bool fits(const Spec& spec, const Tensor& x, const Tensor& theta) {
  return x.device() == spec.device && x.scalar_type() == spec.x_dtype && x.sizes().equals(spec.x_sizes) &&
         x.strides().equals(spec.x_strides) && aligned(x) && theta.device() == spec.device &&
         theta.scalar_type() == spec.theta_dtype && theta.sizes().equals(spec.theta_sizes) && aligned(theta);
}

// Per (device, stream): fp32 partials and a zero int32 counter (kernels/partial_sums.py), kept between
// launches on that stream; while the stream is being captured, new ones (the graph zeroes its counter).
std::mutex scratch_mutex;
std::map<std::pair<int, uint64_t>, std::pair<Tensor, Tensor>> scratch;

std::pair<Tensor, Tensor> partials_and_counter(c10::Device device, void* stream, int64_t programs) {
  auto fp32 = at::TensorOptions().dtype(at::kFloat).device(device);
  auto int32 = at::TensorOptions().dtype(at::kInt).device(device);
  int capture_status = 0;
  if (driver().stream_is_capturing(stream, &capture_status) != 0 || capture_status != 0) {
    return {at::empty({programs}, fp32), at::zeros({1}, int32)};
  }
  std::lock_guard<std::mutex> lock(scratch_mutex);
  auto key = std::make_pair(static_cast<int>(device.index()), reinterpret_cast<uint64_t>(stream));
  auto found = scratch.find(key);
  if (found == scratch.end() || found->second.first.numel() < programs) {
    Tensor counter = found == scratch.end() ? at::zeros({1}, int32) : found->second.second;
    int64_t capacity = 1;
    while (capacity < programs) capacity <<= 1;
    found = scratch.insert_or_assign(key, std::make_pair(at::empty({capacity}, fp32), counter)).first;
  }
  return found->second;
}

struct ThresholdNode : public torch::autograd::Function<ThresholdNode> {
  // `stream`: the current CUDA stream of x's device (the caller's torch.cuda.current_stream). The backward
  // launches on it too: autograd runs each node's backward on the stream its forward ran on.
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& theta, int64_t index,
                        int64_t stream) {
    Spec* spec = spec_at(index);
    c10::DeviceGuard guard(spec->device);
    Tensor out = at::empty_like(x);  // x's strides (dense: the kernels index it as a flat buffer)
    uint64_t pointers[kNumRoles] = {};
    pointers[kX] = address(x);
    pointers[kOut] = address(out);
    pointers[kTheta] = address(theta);
    spec->forward.launch(pointers, reinterpret_cast<void*>(stream));
    ctx->save_for_backward({x, theta});
    ctx->saved_data["spec"] = index;
    ctx->saved_data["stream"] = stream;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list saved = ctx->get_saved_variables();
    const Tensor& x = saved[0];
    const Tensor& theta = saved[1];
    Spec* spec = spec_at(ctx->saved_data["spec"].toInt());
    const bool grad_threshold = ctx->needs_input_grad(1);
    const Tensor& grad_out = grads[0];
    Tensor grad_x, grad_theta;
    if (spec->has_backward[grad_threshold].load(std::memory_order_acquire) && grad_out.strides().equals(x.strides()) &&
        grad_out.scalar_type() == x.scalar_type() && aligned(grad_out)) {
      c10::DeviceGuard guard(spec->device);
      void* stream = reinterpret_cast<void*>(ctx->saved_data["stream"].toInt());
      grad_x = at::empty_like(x);
      uint64_t pointers[kNumRoles] = {};
      pointers[kX] = address(x);
      pointers[kGradOut] = address(grad_out);
      pointers[kGradX] = address(grad_x);
      pointers[kTheta] = address(theta);
      std::pair<Tensor, Tensor> partials;  // kept alive until the launch is queued
      if (grad_threshold) {
        partials = partials_and_counter(spec->device, stream, spec->backward_programs);
        grad_theta = at::empty_like(theta);
        pointers[kPartials] = address(partials.first);
        pointers[kCounter] = address(partials.second);
        pointers[kGradTheta] = address(grad_theta);
      }
      spec->backward[grad_threshold].launch(pointers, stream);
    } else {
      py::gil_scoped_acquire gil;
      py::tuple result = spec->python_backward(grad_out, x, theta, grad_threshold);
      grad_x = result[0].cast<Tensor>();
      if (grad_threshold) grad_theta = result[1].cast<Tensor>();
    }
    return {grad_x, grad_theta, Tensor(), Tensor()};
  }
};

Kernel make_kernel(uint64_t function, unsigned grid, unsigned threads, unsigned shared_bytes,
                   std::vector<int> roles, std::vector<uint64_t> values) {
  TORCH_CHECK(roles.size() == values.size() && roles.size() <= kMaxParams,
              "threshold_node: a kernel takes at most ", kMaxParams, " arguments, one value per role");
  for (int role : roles) {
    TORCH_CHECK(role >= kFixed && role < kNumRoles, "threshold_node: unknown role ", role);
  }
  Kernel kernel;
  kernel.function = reinterpret_cast<void*>(function);
  kernel.grid = grid;
  kernel.threads = threads;
  kernel.shared_bytes = shared_bytes;
  kernel.roles = std::move(roles);
  kernel.values = std::move(values);
  return kernel;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "The eager autograd node of a neuron with a threshold: one Triton launch forward, one backward.";
  m.attr("ROLES") = py::dict(py::arg("x") = static_cast<int>(kX), py::arg("out") = static_cast<int>(kOut),
                             py::arg("theta") = static_cast<int>(kTheta),
                             py::arg("grad_out") = static_cast<int>(kGradOut),
                             py::arg("grad_x") = static_cast<int>(kGradX),
                             py::arg("partials") = static_cast<int>(kPartials),
                             py::arg("counter") = static_cast<int>(kCounter),
                             py::arg("grad_theta") = static_cast<int>(kGradTheta));
  m.def(
      "new_spec",
      [](const Tensor& x, const Tensor& theta, int64_t backward_programs, uint64_t function, unsigned grid,
         unsigned threads, unsigned shared_bytes, std::vector<int> roles, std::vector<uint64_t> values,
         py::object python_backward) {
        TORCH_CHECK(x.is_non_overlapping_and_dense() && x.device() == theta.device(),
                    "threshold_node: a spec takes a dense x, on the threshold's device");
        auto* spec = new Spec();
        spec->device = x.device();
        spec->x_dtype = x.scalar_type();
        spec->theta_dtype = theta.scalar_type();
        spec->x_sizes = x.sizes().vec();
        spec->x_strides = x.strides().vec();
        spec->theta_sizes = theta.sizes().vec();
        spec->backward_programs = backward_programs;
        spec->forward = make_kernel(function, grid, threads, shared_bytes, std::move(roles), std::move(values));
        spec->python_backward = std::move(python_backward);
        std::lock_guard<std::mutex> lock(specs_mutex);
        specs.push_back(spec);
        return static_cast<int64_t>(specs.size() - 1);
      },
      "A spec from its forward kernel, for inputs like x and theta; returns its index.");
  m.def(
      "set_backward",
      [](int64_t index, bool grad_threshold, uint64_t function, unsigned grid, unsigned threads,
         unsigned shared_bytes, std::vector<int> roles, std::vector<uint64_t> values) {
        Spec* spec = spec_at(index);
        if (spec->has_backward[grad_threshold].load(std::memory_order_acquire)) return;
        spec->backward[grad_threshold] =
            make_kernel(function, grid, threads, shared_bytes, std::move(roles), std::move(values));
        spec->has_backward[grad_threshold].store(true, std::memory_order_release);
      },
      "Sets a spec's backward kernel, with or without the threshold's gradient (once; later calls do nothing).");
  m.def(
      "apply",
      [](const Tensor& x, const Tensor& theta, int64_t index, int64_t stream) -> py::object {
        if (!fits(*spec_at(index), x, theta)) {
          return py::none();  // the Python path: another kind of input, or another specialization
        }
        return py::cast(ThresholdNode::apply(x, theta, index, stream));
      },
      "The neuron's output through the C++ node, launched on `stream` (the current raw CUDA stream of x's "
      "device), or None where the spec's kernels do not fit these inputs.");
  m.def(
      "pack_arguments",
      [](std::vector<int> roles, std::vector<uint64_t> values, std::vector<uint64_t> pointers) {
        Kernel kernel = make_kernel(0, 1, 32, 0, std::move(roles), std::move(values));
        TORCH_CHECK(pointers.size() == kNumRoles, "threshold_node: one pointer per role");
        uint64_t by_role[kNumRoles];
        std::copy(pointers.begin(), pointers.end(), by_role);
        uint64_t arguments[kMaxParams + 2];
        const size_t count = kernel.pack(by_role, arguments);
        return std::vector<uint64_t>(arguments, arguments + count);
      },
      "The 64-bit argument slots a launch passes (tests: no GPU needed).");
}
