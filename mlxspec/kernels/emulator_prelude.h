// Metal Shading Language emulation for running mx.fast.metal_kernel bodies on a CPU.
//
// Used by mlxspec/kernels/emulator.py, which wraps a kernel body in the same signature
// MLX generates and appends a driver that calls `mlxemu::launch`. Every thread of a
// threadgroup is a fiber (its own stack); fibers switch cooperatively at
// threadgroup_barrier, simdgroup_barrier and every SIMD-group collective, so barriers and
// 32-lane collectives behave as on the GPU for kernels whose control flow reaching them is
// uniform (which Metal requires of barriers anyway). Divergent barriers/collectives and
// deadlocks are reported as errors rather than silently hanging.
//
// Not emulated: the Metal compiler's code generation, half-precision rounding inside the
// GPU's ALUs, FMA contraction, denormal flushing, occupancy and the memory model beyond
// "everything is visible after a barrier". See README.md.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__x86_64__) && !defined(MLXEMU_UCONTEXT)
#define MLXEMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

// ---- address spaces and attributes --------------------------------------------------
#define device
#define constant
#define thread
// `threadgroup` is handled by emulator.py before compiling: a threadgroup variable
// declaration becomes a thread_local static (all fibers of a group run on one OS thread,
// one group at a time, so that is one object per group); a threadgroup pointer's
// qualifier is dropped.
#define METAL_FUNC inline

// ---- scalar and vector types ---------------------------------------------------------
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef _Float16 half;
typedef _Float16 float16_t;

struct bfloat16_t {
  uint16_t bits;
  bfloat16_t() = default;
  bfloat16_t(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
      bits = uint16_t((u >> 16) | 0x40);  // quiet NaN
    } else {
      bits = uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);  // round to nearest even
    }
  }
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};
typedef bfloat16_t bfloat;

template <typename T>
struct vec3 {
  T x, y, z;
};
template <typename T>
struct vec4 {
  T x, y, z, w;
  vec4() = default;
  vec4(T a) : x(a), y(a), z(a), w(a) {}
  vec4(T a, T b, T c, T d) : x(a), y(b), z(c), w(d) {}
  T& operator[](int i) { return (&x)[i]; }
  const T& operator[](int i) const { return (&x)[i]; }
  vec4 operator+(const vec4& o) const { return {x + o.x, y + o.y, z + o.z, w + o.w}; }
  vec4 operator-(const vec4& o) const { return {x - o.x, y - o.y, z - o.z, w - o.w}; }
  vec4 operator*(const vec4& o) const { return {x * o.x, y * o.y, z * o.z, w * o.w}; }
  vec4& operator+=(const vec4& o) { return *this = *this + o; }
};
typedef vec3<uint> uint3;
typedef vec4<float> float4;
typedef vec4<uint> uint4;

template <typename To, typename From>
inline To as_type(const From& v) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs equal sizes");
  To out;
  std::memcpy(&out, &v, sizeof(To));
  return out;
}

// ---- metal:: math --------------------------------------------------------------------
namespace metal {
using std::numeric_limits;
inline float exp(float x) { return std::exp(x); }
inline float log(float x) { return std::log(x); }
inline float abs(float x) { return std::fabs(x); }
inline float sqrt(float x) { return std::sqrt(x); }
inline bool isnan(float x) { return std::isnan(x); }
inline bool isinf(float x) { return std::isinf(x); }
inline bool isfinite(float x) { return std::isfinite(x); }
template <typename T>
inline T max(T a, T b) { return a > b ? a : b; }
template <typename T>
inline T min(T a, T b) { return a < b ? a : b; }
template <typename T>
inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
inline float fmax(float a, float b) { return std::fmax(a, b); }
inline float fmin(float a, float b) { return std::fmin(a, b); }
inline float select(float a, float b, bool c) { return c ? b : a; }
namespace fast {
inline float exp(float x) { return std::exp(x); }
inline float log(float x) { return std::log(x); }
}  // namespace fast
namespace precise {
inline float exp(float x) { return std::exp(x); }
inline float log(float x) { return std::log(x); }
}  // namespace precise
enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
}  // namespace metal
using namespace metal;

// ---- fibers and the scheduler --------------------------------------------------------
namespace mlxemu {

struct Fiber;
void fiber_main();

#if defined(MLXEMU_ASM_SWITCH)
extern "C" void mlxemu_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.p2align 4
.hidden mlxemu_switch
.globl mlxemu_switch
.type mlxemu_switch,@function
mlxemu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size mlxemu_switch, .-mlxemu_switch
)");
#endif

constexpr size_t kStackBytes = 256 * 1024;

struct Barrier {
  int expected = 0;
  int arrived = 0;
  uint64_t generation = 0;
  int tag = 0;  // what the first arriving thread is waiting for (to detect divergence)
};

struct Simd {
  Barrier barrier;
  int lanes = 0;
  alignas(16) unsigned char slots[32][64];
};

struct Thread {
  uint3 thread_position_in_grid, thread_position_in_threadgroup, threadgroup_position_in_grid;
  uint3 threads_per_threadgroup, threadgroups_per_grid, threads_per_grid, grid_size, grid_origin;
  uint3 dispatch_threads_per_threadgroup;
  uint thread_index_in_threadgroup, simdgroup_index_in_threadgroup, thread_index_in_simdgroup;
  uint simdgroups_per_threadgroup, dispatch_simdgroups_per_threadgroup, threads_per_simdgroup;
  uint thread_execution_width, quadgroup_index_in_threadgroup, thread_index_in_quadgroup;
  uint quadgroups_per_threadgroup, dispatch_quadgroups_per_threadgroup;
};

struct Fiber {
  Thread t;
  void* sp = nullptr;
  char* stack = nullptr;
  bool done = false;
  Barrier* waiting = nullptr;
  uint64_t wait_generation = 0;
#if !defined(MLXEMU_ASM_SWITCH)
  ucontext_t ctx;
#endif
};

struct Group {
  std::vector<Fiber> fibers;
  Barrier tg_barrier;
  std::vector<Simd> simds;
  const void* body = nullptr;
  void (*invoke)(const void*, const Thread&) = nullptr;
  std::string error;
  Fiber* current = nullptr;
  void* sched_sp = nullptr;
#if !defined(MLXEMU_ASM_SWITCH)
  ucontext_t sched_ctx;
#endif
};

inline thread_local Group* g_group = nullptr;

inline void switch_to_scheduler() {
  Group* g = g_group;
  Fiber* f = g->current;
#if defined(MLXEMU_ASM_SWITCH)
  mlxemu_switch(&f->sp, g->sched_sp);
#else
  swapcontext(&f->ctx, &g->sched_ctx);
#endif
}

inline void switch_to(Fiber* f) {
  Group* g = g_group;
  g->current = f;
#if defined(MLXEMU_ASM_SWITCH)
  mlxemu_switch(&g->sched_sp, f->sp);
#else
  swapcontext(&g->sched_ctx, &f->ctx);
#endif
}

[[noreturn]] inline void fail(const std::string& msg) {
  Group* g = g_group;
  if (g->error.empty()) g->error = msg;
  for (;;) switch_to_scheduler();  // the scheduler stops at the first error
}

// Wait until every participant of `b` has arrived. `tag` names the operation so two
// threads waiting at different kinds of synchronisation are reported, not merged.
inline void arrive_and_wait(Barrier& b, int tag) {
  if (b.arrived == 0) {
    b.tag = tag;
  } else if (b.tag != tag) {
    fail("divergent control flow: threads of one group wait at different barriers/collectives (tags " +
         std::to_string(b.tag) + " vs " + std::to_string(tag) + ")");
  }
  Fiber* f = g_group->current;
  if (++b.arrived == b.expected) {
    b.arrived = 0;
    ++b.generation;
    return;
  }
  f->waiting = &b;
  f->wait_generation = b.generation;
  switch_to_scheduler();
}

inline void fiber_main() {
  Group* g = g_group;
  Fiber* f = g->current;
  g->invoke(g->body, f->t);
  f->done = true;
  for (;;) switch_to_scheduler();
}

#if !defined(MLXEMU_ASM_SWITCH)
inline void fiber_entry_ucontext() { fiber_main(); }
#endif

inline void prepare(Fiber& f) {
  f.done = false;
  f.waiting = nullptr;
#if defined(MLXEMU_ASM_SWITCH)
  uintptr_t top = (uintptr_t(f.stack) + kStackBytes) & ~uintptr_t(15);
  uint64_t* sp = reinterpret_cast<uint64_t*>(top);
  *--sp = 0;                                        // fake return address of fiber_main
  *--sp = reinterpret_cast<uint64_t>(&fiber_main);  // `ret` of the first switch lands here
  for (int i = 0; i < 6; ++i) *--sp = 0;            // rbp rbx r12 r13 r14 r15
  uint32_t csr[2];
  asm volatile("stmxcsr %0" : "=m"(csr[0]));
  asm volatile("fnstcw %0" : "=m"(csr[1]));
  --sp;
  std::memcpy(sp, csr, 8);
  f.sp = sp;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack;
  f.ctx.uc_stack.ss_size = kStackBytes;
  f.ctx.uc_link = nullptr;
  makecontext(&f.ctx, fiber_entry_ucontext, 0);
#endif
}

// Run one threadgroup to completion; returns false (with g.error set) on an error.
inline bool run_group(Group& g) {
  for (auto& f : g.fibers) prepare(f);
  size_t n = g.fibers.size();
  size_t finished = 0;
  while (finished < n) {
    bool progressed = false;
    for (auto& f : g.fibers) {
      if (f.done) continue;
      if (f.waiting && f.waiting->generation == f.wait_generation) continue;
      f.waiting = nullptr;
      switch_to(&f);
      progressed = true;
      if (!g.error.empty()) return false;
      if (f.done) ++finished;
    }
    if (!progressed) {
      g.error = "deadlock: " + std::to_string(n - finished) +
                " threads wait at a barrier or SIMD collective that the other " +
                std::to_string(finished) + " threads of the group never reach";
      return false;
    }
  }
  if (g.tg_barrier.arrived) {
    g.error = "a threadgroup barrier was reached by only some threads";
    return false;
  }
  return true;
}

struct Stacks {
  std::vector<char*> blocks;
  ~Stacks() {
    for (char* b : blocks) munmap(b, kStackBytes);
  }
  char* get(size_t i) {
    while (blocks.size() <= i) {
      void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p == MAP_FAILED) return nullptr;
      mprotect(p, 4096, PROT_NONE);  // guard page: a stack overflow faults instead of corrupting
      blocks.push_back(static_cast<char*>(p));
    }
    return blocks[i];
  }
};

inline uint div_up(uint a, uint b) { return (a + b - 1) / b; }

// dispatchThreads(grid, threadgroup) as MLX issues it: threadgroup dims are min(tg, grid),
// edge groups are cut to the grid (non-uniform threadgroups).
template <typename Body>
int launch(const long long* grid_in, const long long* tg_in, char* err, int errlen, const Body& body) {
  uint grid[3], tg[3], ngroups[3];
  for (int d = 0; d < 3; ++d) {
    grid[d] = uint(grid_in[d]);
    tg[d] = uint(tg_in[d] < grid_in[d] ? tg_in[d] : grid_in[d]);
    if (tg[d] == 0) tg[d] = 1;
    ngroups[d] = grid[d] ? div_up(grid[d], tg[d]) : 0;
  }
  if (uint64_t(tg[0]) * tg[1] * tg[2] > 1024) {
    std::snprintf(err, errlen, "threadgroup of %u threads exceeds 1024", tg[0] * tg[1] * tg[2]);
    return 1;
  }
  Group g;
  Stacks stacks;
  g.body = &body;
  g.invoke = [](const void* b, const Thread& t) { (*static_cast<const Body*>(b))(t); };
  Group* saved = g_group;
  g_group = &g;
  for (uint gz = 0; gz < ngroups[2]; ++gz)
    for (uint gy = 0; gy < ngroups[1]; ++gy)
      for (uint gx = 0; gx < ngroups[0]; ++gx) {
        uint gpos[3] = {gx, gy, gz};
        uint size[3];
        for (int d = 0; d < 3; ++d) size[d] = std::min(tg[d], grid[d] - gpos[d] * tg[d]);
        uint n = size[0] * size[1] * size[2];
        uint nsimd = div_up(n, 32);
        g.fibers.assign(n, Fiber{});
        g.simds.assign(nsimd, Simd{});
        g.tg_barrier = Barrier{};
        g.tg_barrier.expected = int(n);
        for (uint s = 0; s < nsimd; ++s) {
          g.simds[s].lanes = int(std::min<uint>(32, n - s * 32));
          g.simds[s].barrier.expected = g.simds[s].lanes;
        }
        for (uint i = 0; i < n; ++i) {
          Fiber& f = g.fibers[i];
          f.stack = stacks.get(i);
          if (!f.stack) {
            std::snprintf(err, errlen, "could not allocate a fiber stack");
            g_group = saved;
            return 1;
          }
          Thread& t = f.t;
          uint lx = i % size[0], ly = (i / size[0]) % size[1], lz = i / (size[0] * size[1]);
          t.thread_position_in_threadgroup = {lx, ly, lz};
          t.threadgroup_position_in_grid = {gx, gy, gz};
          t.thread_position_in_grid = {gx * tg[0] + lx, gy * tg[1] + ly, gz * tg[2] + lz};
          t.threads_per_threadgroup = {size[0], size[1], size[2]};
          t.dispatch_threads_per_threadgroup = {tg[0], tg[1], tg[2]};
          t.threadgroups_per_grid = {ngroups[0], ngroups[1], ngroups[2]};
          t.threads_per_grid = {grid[0], grid[1], grid[2]};
          t.grid_size = t.threads_per_grid;
          t.grid_origin = {0, 0, 0};
          t.thread_index_in_threadgroup = i;
          t.simdgroup_index_in_threadgroup = i / 32;
          t.thread_index_in_simdgroup = i % 32;
          t.simdgroups_per_threadgroup = nsimd;
          t.dispatch_simdgroups_per_threadgroup = div_up(tg[0] * tg[1] * tg[2], 32);
          t.threads_per_simdgroup = 32;
          t.thread_execution_width = 32;
          t.quadgroup_index_in_threadgroup = i / 4;
          t.thread_index_in_quadgroup = i % 4;
          t.quadgroups_per_threadgroup = div_up(n, 4);
          t.dispatch_quadgroups_per_threadgroup = div_up(tg[0] * tg[1] * tg[2], 4);
        }
        if (!run_group(g)) {
          std::snprintf(err, errlen, "threadgroup (%u, %u, %u): %s", gx, gy, gz, g.error.c_str());
          g_group = saved;
          return 1;
        }
      }
  g_group = saved;
  return 0;
}

inline const Thread& self() { return g_group->current->t; }

// ---- SIMD-group collectives ------------------------------------------------------------
// Each lane deposits its value, all lanes of the SIMD-group meet, each computes the
// result from every lane's value, and they meet again before the slots can be reused.
template <typename T, typename F>
inline T collective(const T& v, int tag, F reduce) {
  static_assert(sizeof(T) <= 64, "collective value too large");
  const Thread& t = self();
  Simd& s = g_group->simds[t.simdgroup_index_in_threadgroup];
  std::memcpy(s.slots[t.thread_index_in_simdgroup], &v, sizeof(T));
  arrive_and_wait(s.barrier, tag);
  T vals[32];
  for (int i = 0; i < s.lanes; ++i) std::memcpy(&vals[i], s.slots[i], sizeof(T));
  T r = reduce(vals, s.lanes, int(t.thread_index_in_simdgroup));
  arrive_and_wait(s.barrier, tag);
  return r;
}

enum Tag { kBarrier = 1, kSimdBarrier, kSum, kMax, kMin, kPrefixEx, kPrefixIn, kShuffle, kShuffleXor,
           kShuffleDown, kShuffleUp, kBroadcast, kAll, kAny, kProduct };

}  // namespace mlxemu

inline void threadgroup_barrier(metal::mem_flags) {
  mlxemu::arrive_and_wait(mlxemu::g_group->tg_barrier, mlxemu::kBarrier);
}
inline void simdgroup_barrier(metal::mem_flags) {
  const auto& t = mlxemu::self();
  mlxemu::arrive_and_wait(mlxemu::g_group->simds[t.simdgroup_index_in_threadgroup].barrier, mlxemu::kSimdBarrier);
}

template <typename T>
inline T simd_sum(T v) {
  // Pairwise tree in lane order (the shape of a butterfly reduction).
  return mlxemu::collective(v, mlxemu::kSum, [](T* x, int n, int) {
    T buf[32];
    for (int i = 0; i < 32; ++i) buf[i] = i < n ? x[i] : T(0);
    for (int w = 1; w < 32; w *= 2)
      for (int i = 0; i < 32; i += 2 * w) buf[i] = buf[i] + buf[i + w];
    return buf[0];
  });
}
template <typename T>
inline T simd_product(T v) {
  return mlxemu::collective(v, mlxemu::kProduct, [](T* x, int n, int) {
    T r = x[0];
    for (int i = 1; i < n; ++i) r = r * x[i];
    return r;
  });
}
template <typename T>
inline T simd_max(T v) {
  return mlxemu::collective(v, mlxemu::kMax, [](T* x, int n, int) {
    T r = x[0];
    for (int i = 1; i < n; ++i) r = metal::max(r, x[i]);
    return r;
  });
}
template <typename T>
inline T simd_min(T v) {
  return mlxemu::collective(v, mlxemu::kMin, [](T* x, int n, int) {
    T r = x[0];
    for (int i = 1; i < n; ++i) r = metal::min(r, x[i]);
    return r;
  });
}
template <typename T>
inline T simd_prefix_exclusive_sum(T v) {
  return mlxemu::collective(v, mlxemu::kPrefixEx, [](T* x, int, int lane) {
    T r = T(0);
    for (int i = 0; i < lane; ++i) r = r + x[i];
    return r;
  });
}
template <typename T>
inline T simd_prefix_inclusive_sum(T v) {
  return mlxemu::collective(v, mlxemu::kPrefixIn, [](T* x, int, int lane) {
    T r = x[0];
    for (int i = 1; i <= lane; ++i) r = r + x[i];
    return r;
  });
}
template <typename T>
inline T simd_shuffle(T v, ushort src) {
  return mlxemu::collective(v, mlxemu::kShuffle, [src](T* x, int n, int) { return x[src % 32 < uint(n) ? src % 32 : 0]; });
}
template <typename T>
inline T simd_broadcast(T v, ushort src) {
  return mlxemu::collective(v, mlxemu::kBroadcast, [src](T* x, int n, int) { return x[src % 32 < uint(n) ? src % 32 : 0]; });
}
template <typename T>
inline T simd_shuffle_xor(T v, ushort mask) {
  return mlxemu::collective(v, mlxemu::kShuffleXor, [mask](T* x, int n, int lane) {
    int src = lane ^ (mask & 31);
    return src < n ? x[src] : x[lane];
  });
}
template <typename T>
inline T simd_shuffle_down(T v, ushort delta) {
  return mlxemu::collective(v, mlxemu::kShuffleDown, [delta](T* x, int n, int lane) {
    int src = lane + delta;
    return src < n ? x[src] : x[lane];
  });
}
template <typename T>
inline T simd_shuffle_up(T v, ushort delta) {
  return mlxemu::collective(v, mlxemu::kShuffleUp, [delta](T* x, int, int lane) {
    int src = lane - int(delta);
    return src >= 0 ? x[src] : x[lane];
  });
}
inline bool simd_all(bool v) {
  return mlxemu::collective(v, mlxemu::kAll, [](bool* x, int n, int) {
    for (int i = 0; i < n; ++i)
      if (!x[i]) return false;
    return true;
  });
}
inline bool simd_any(bool v) {
  return mlxemu::collective(v, mlxemu::kAny, [](bool* x, int n, int) {
    for (int i = 0; i < n; ++i)
      if (x[i]) return true;
    return false;
  });
}
