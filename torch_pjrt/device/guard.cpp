// pjrt's device guard: the C++ object PyTorch asks, for the PrivateUse1 device type,
// which device is current, how many there are, and how to record, wait for and time
// events. A guard registered from Python (torch._C._acc.DeviceGuard) answers one device
// and no events, so the autograd engine has no queue for pjrt:1 and torch.Event raises.
//
// Built by torch_pjrt/device/guard.py with the C++ compiler against PyTorch's own
// headers and libc10 (no Python headers: Python calls in through ctypes). The current
// device is per thread, as CUDA's is; the device count and the waits are Python's
// answers (torch_pjrt.runtime), through the callbacks given to pjrt_guard_install.

#include <ATen/Context.h>
#include <ATen/SDPBackend.h>
#include <ATen/core/Generator.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/GeneratorImpl.h>
#include <c10/core/TensorImpl.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <mutex>
#include <string>
#include <unordered_map>

namespace {

using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::EventFlag;
using c10::Stream;

// Python's side. count(): the device count (0 when there is no platform); wait(i): wait
// for pjrt:i's queue, 0 on success, else nonzero after pjrt_guard_fail(message).
using CountFn = int (*)();
using WaitFn = int (*)(int);

CountFn py_count = nullptr;
WaitFn py_wait = nullptr;
thread_local std::string failure;

thread_local DeviceIndex current = 0;
thread_local std::unordered_map<DeviceIndex, c10::StreamId> current_streams;

c10::StreamId current_stream(DeviceIndex index) {
  auto found = current_streams.find(index);
  return found == current_streams.end() ? 0 : found->second;
}

struct EventState {
  DeviceIndex device = -1;
  double time_ms = 0.0;  // host time after the device's queue drained (timing events)
};
std::mutex events_lock;
std::unordered_map<std::uintptr_t, EventState> events;
std::atomic<std::uintptr_t> next_event{1};
std::atomic<c10::StreamId> next_stream{1};

void wait_for(DeviceIndex index) {
  TORCH_CHECK(py_wait != nullptr, "pjrt: the device guard is not installed");
  failure.clear();
  TORCH_CHECK(py_wait(static_cast<int>(index)) == 0, failure);
}

// A device without an index (pjrt) is the current device, as for CUDA.
Device resolved(Device d) {
  return d.has_index() ? d : Device(DeviceType::PrivateUse1, current);
}

double now_ms() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

struct Guard final : public c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override {
    return DeviceType::PrivateUse1;
  }
  Device exchangeDevice(Device d) const override {
    Device old(type(), current);
    current = d.index();
    return old;
  }
  Device getDevice() const override {
    return Device(type(), current);
  }
  void setDevice(Device d) const override {
    current = d.index();
  }
  void uncheckedSetDevice(Device d) const noexcept override {
    current = d.index();
  }
  DeviceIndex deviceCount() const noexcept override {
    int count = py_count != nullptr ? py_count() : 1;
    return static_cast<DeviceIndex>(count < 0 ? 0 : count);
  }

  // One in-order queue a device (docs/device_api.md): every stream is that queue. New
  // streams get ids of their own (torch.Stream(device="pjrt") objects are told apart, as
  // CUDA's are), and each thread has a current stream per device, as on CUDA (the
  // default stream, id 0, until one is set).
  Stream getStream(Device d) const override {
    Device r = resolved(d);
    return Stream(Stream::UNSAFE, r, current_stream(r.index()));
  }
  Stream getDefaultStream(Device d) const override {
    return Stream(Stream::DEFAULT, resolved(d));
  }
  Stream getNewStream(Device d, int priority) const override {
    return Stream(Stream::UNSAFE, resolved(d), next_stream.fetch_add(1));
  }
  Stream getStreamFromGlobalPool(Device d, bool high_priority) const override {
    return Stream(Stream::UNSAFE, resolved(d), next_stream.fetch_add(1));
  }
  // As CUDA's: the stream's device's current stream changes, not the current device
  // (a StreamGuard changes that through exchangeDevice).
  Stream exchangeStream(Stream s) const override {
    Stream old(Stream::UNSAFE, s.device(), current_stream(s.device_index()));
    current_streams[s.device_index()] = s.id();
    return old;
  }
  bool queryStream(const Stream& stream) const override {
    return true;  // as torch.pjrt.Stream.query: work in the queue runs in order
  }
  void synchronizeStream(const Stream& stream) const override {
    wait_for(stream.device_index());
  }
  void synchronizeDevice(const DeviceIndex index) const override {
    wait_for(index < 0 ? current : index);
  }

  // Events: a point in a device's queue. A timing event waits for the queue when
  // recorded and keeps the host time (torch.pjrt.Event's rule).
  void record(void** event, const Stream& stream, const DeviceIndex index,
              const EventFlag flag) const override {
    TORCH_CHECK(index == -1 || index == stream.device_index(), "Event device index ", index,
                " does not match recording stream's device index ", stream.device_index(), ".");
    if (*event == nullptr) {
      *event = reinterpret_cast<void*>(next_event.fetch_add(1));
    }
    EventState state;
    state.device = stream.device_index();
    if (flag == EventFlag::BACKEND_DEFAULT) {
      wait_for(state.device);
      state.time_ms = now_ms();
    }
    std::lock_guard<std::mutex> hold(events_lock);
    events[reinterpret_cast<std::uintptr_t>(*event)] = state;
  }
  void block(void* event, const Stream& stream) const override {}  // one queue: in order
  bool queryEvent(void* event) const override {
    return true;
  }
  void synchronizeEvent(void* event) const override {
    DeviceIndex device = -1;
    {
      std::lock_guard<std::mutex> hold(events_lock);
      auto found = events.find(reinterpret_cast<std::uintptr_t>(event));
      if (found != events.end()) {
        device = found->second.device;
      }
    }
    if (device >= 0) {
      wait_for(device);
    }
  }
  double elapsedTime(void* start, void* end, const DeviceIndex index) const override {
    std::lock_guard<std::mutex> hold(events_lock);
    auto first = events.find(reinterpret_cast<std::uintptr_t>(start));
    auto last = events.find(reinterpret_cast<std::uintptr_t>(end));
    TORCH_CHECK(first != events.end() && last != events.end(),
                "Both events must be recorded before calculating elapsed time.");
    return last->second.time_ms - first->second.time_ms;
  }
  void destroyEvent(void* event, const DeviceIndex index) const noexcept override {
    std::lock_guard<std::mutex> hold(events_lock);
    events.erase(reinterpret_cast<std::uintptr_t>(event));
  }
};

Guard guard;

// The allocator PyTorch's own storage constructors ask (torch.UntypedStorage(n,
// device="pjrt")): a fake address from a range of its own, the way torch_pjrt's tensors
// get theirs (device/tensor.py), never dereferenced; the data is a JAX array that
// torch_pjrt hangs on the storage when it is first used. Without one, PyTorch calls a
// null allocator and the process dies.
void no_delete(void*) {}

struct Allocator final : public c10::Allocator {
  std::atomic<std::uintptr_t> next{0x7D00000000000000ULL};
  c10::DataPtr allocate(size_t n) override {
    std::uintptr_t address = next.fetch_add((std::max<size_t>(n, 1) + 255) & ~size_t(255));
    void* pointer = reinterpret_cast<void*>(address);
    return {pointer, pointer, &no_delete, Device(DeviceType::PrivateUse1, current)};
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return &no_delete;
  }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    TORCH_CHECK(false, "pjrt storages hold no host bytes to copy: copy their tensors instead");
  }
};

Allocator allocator;

// torch.Generator(device="pjrt"): a seed and an offset, as a device's own RNG state
// (device/random.py): a random op given the generator draws with the key of (seed,
// offset) and moves the offset on (ops/registry.py). The state is torch.pjrt's layout:
// 16 bytes, the seed then the offset, little-endian.
struct Generator final : public c10::GeneratorImpl {
  explicit Generator(DeviceIndex index)
      : c10::GeneratorImpl(Device(DeviceType::PrivateUse1, index),
                           c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)) {}
  void set_current_seed(uint64_t seed) override {
    seed_ = seed;
    offset_ = 0;
  }
  uint64_t current_seed() const override {
    return seed_;
  }
  uint64_t seed() override {
    std::random_device source;
    set_current_seed((static_cast<uint64_t>(source()) << 32 | source()) >> 1);
    return seed_;
  }
  void set_offset(uint64_t offset) override {
    offset_ = offset;
  }
  uint64_t get_offset() const override {
    return offset_;
  }
  void set_state(const c10::TensorImpl& state) override {
    TORCH_CHECK(state.numel() == 16 && state.dtype().itemsize() == 1 &&
                    state.device().is_cpu(),
                "a pjrt generator's state is a CPU uint8 tensor of 16 bytes (its seed and "
                "offset), as get_state() gives; got ", state.numel(), " elements");
    const char* bytes = static_cast<const char*>(state.data());
    std::memcpy(&seed_, bytes, 8);
    std::memcpy(&offset_, bytes + 8, 8);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    c10::Storage storage(c10::Storage::use_byte_size_t(), 16, c10::GetCPUAllocator(), false);
    auto state = c10::make_intrusive<c10::TensorImpl>(
        std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
        caffe2::TypeMeta::Make<uint8_t>());
    state->set_sizes_contiguous({16});
    char* bytes = static_cast<char*>(state->mutable_data());
    std::memcpy(bytes, &seed_, 8);
    std::memcpy(bytes + 8, &offset_, 8);
    return state;
  }
  static DeviceType device_type() {
    return DeviceType::PrivateUse1;
  }

 private:
  Generator* clone_impl() const override {
    auto copy = new Generator(device().index());
    copy->seed_ = seed_;
    copy->offset_ = offset_;
    return copy;
  }
  uint64_t seed_ = 67280421310721ULL;  // PyTorch's default seed
  uint64_t offset_ = 0;
};

struct Quiet final : public c10::WarningHandler {
  void process(const c10::Warning&) override {}
};

at::Generator new_generator(DeviceIndex index) {
  return at::make_generator<Generator>(index < 0 ? current : index);
}

// --- F.scaled_dot_product_attention's backend choice ---------------------------------
//
// PyTorch's SDPA composite asks the device type's _fused_sdp_choice_stub which backend
// runs a call. pjrt answers OVERRIDEABLE for the calls its kernel of
// aten::_scaled_dot_product_fused_attention_overrideable takes (torch_pjrt/kernels/
// attention.py: the flash kernel or XLA, per chip), and MATH, PyTorch's own composite,
// for the others: dropout, ranks other than 3 or 4, dtypes other than float32, float16
// and bfloat16, heads that differ without enable_gqa, nested tensors. The same answer is
// the PrivateUse1 kernel of torch._fused_sdp_choice. torch_pjrt.export turns the
// overrideable answer off while it decomposes a program (pjrt_guard_set_sdpa).

std::atomic<bool> sdpa_overrideable{true};

bool overrideable_takes(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                        double dropout_p, bool enable_gqa) {
  if (q.is_nested() || k.is_nested() || v.is_nested() || dropout_p > 0.0) {
    return false;
  }
  const int64_t rank = q.dim();
  if ((rank != 3 && rank != 4) || k.dim() != rank || v.dim() != rank) {
    return false;
  }
  const auto dtype = q.scalar_type();
  if (k.scalar_type() != dtype || v.scalar_type() != dtype ||
      (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16)) {
    return false;
  }
  if (rank == 4 && (q.sym_size(0) != k.sym_size(0) || k.sym_size(0) != v.sym_size(0))) {
    return false;
  }
  if (q.sym_size(-1) != k.sym_size(-1) || k.sym_size(-2) != v.sym_size(-2)) {
    return false;
  }
  const c10::SymInt hq = q.sym_size(-3), hkv = k.sym_size(-3);
  if (hkv != v.sym_size(-3)) {
    return false;
  }
  return hq == hkv || (enable_gqa && hq % hkv == 0);
}

int64_t sdp_choice(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const std::optional<at::Tensor>& /*attn_mask*/, double dropout_p,
                   bool /*is_causal*/, std::optional<double> /*scale*/, bool enable_gqa) {
  auto& context = at::globalContext();
  if (sdpa_overrideable.load() && context.userEnabledOverrideableSDP() &&
      overrideable_takes(q, k, v, dropout_p, enable_gqa)) {
    return static_cast<int64_t>(at::SDPBackend::overrideable);
  }
  TORCH_CHECK(context.userEnabledMathSDP(),
              "scaled_dot_product_attention on pjrt: no backend is enabled for this call "
              "(pjrt runs OVERRIDEABLE for calls without dropout, of 3-D or 4-D float32, "
              "float16 or bfloat16 tensors, and MATH for the others); enable "
              "SDPBackend.MATH or SDPBackend.OVERRIDEABLE in torch.nn.attention.sdpa_kernel");
  return static_cast<int64_t>(at::SDPBackend::math);
}

std::unique_ptr<torch::Library> aten_kernels;

}  // namespace

extern "C" {

// Register the guard for PrivateUse1, replacing the Python one, the allocator, the
// generator and SDPA's backend choice; returns 0.
int pjrt_guard_install(CountFn count, WaitFn wait) {
  py_count = count;
  py_wait = wait;
  c10::impl::device_guard_impl_registry[static_cast<size_t>(DeviceType::PrivateUse1)].store(
      &guard);
  c10::SetAllocator(DeviceType::PrivateUse1, &allocator);
  if (!at::GetGeneratorPrivate().has_value()) {
    // NOTE: PyTorch calls this registration deprecated in favour of a C++ hooks object's
    // getNewGenerator; a Python backend's hooks object is Python's (PyTorch's own setup
    // registers it), so this is the one way in: its warning is kept off stderr
    Quiet quiet;
    c10::WarningUtils::WarningHandlerGuard hold(&quiet);
    at::_GeneratorRegister register_generator(&new_generator);
  }
  at::native::_fused_sdp_choice_stub.set_privateuse1_dispatch_ptr(&sdp_choice);
  if (!aten_kernels) {
    aten_kernels = std::make_unique<torch::Library>(
        torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    aten_kernels->impl("_fused_sdp_choice", TORCH_FN(sdp_choice));
    // The view primitives: PyTorch's own (CPU's and CUDA's) kernels, which alias the
    // storage with new sizes and strides and never touch the data, so any device's
    // tensors take them; in C++ a view costs no call into Python (ops/views.py keeps
    // the same kernels in Python for a process without this library).
    aten_kernels->impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
    aten_kernels->impl("view", TORCH_FN(at::native::view));
    aten_kernels->impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
    aten_kernels->impl("unfold", TORCH_FN(at::native::unfold));
    aten_kernels->impl("view_as_real", TORCH_FN(at::native::view_as_real));
    aten_kernels->impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  }
  return 0;
}

// SDPA's overrideable backend on (1) or off (0, PyTorch's math for every call).
void pjrt_guard_set_sdpa(int on) {
  sdpa_overrideable.store(on != 0);
}

// Python's wait callback says why it failed, before returning nonzero.
void pjrt_guard_fail(const char* message) {
  failure = message;
}

int pjrt_guard_current_device() {
  return current;
}

void pjrt_guard_set_current_device(int index) {
  current = static_cast<DeviceIndex>(index);
}

// This thread's current stream of pjrt:index (torch.accelerator's get and set).
int64_t pjrt_guard_current_stream(int index) {
  return current_stream(static_cast<DeviceIndex>(index));
}

void pjrt_guard_set_current_stream(int index, int64_t id) {
  current_streams[static_cast<DeviceIndex>(index)] = id;
}

}  // extern "C"
