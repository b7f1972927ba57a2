// Helpers shared by every generated kernel: the reference interpreter's numerics (f16/bf16
// rounding, saturating float-to-int casts, wrapping integer maths, its f32 `exp`) and the race
// check that runs after a launch. Compiled with --fmad=false, so a*b+c rounds twice, as in Rust.
typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define TG_MANY 0xFFFFFFFEu
#define TG_NAN_F __int_as_float(0x7fc00000)
#define TG_NAN_D __longlong_as_double(0x7ff8000000000000LL)
#define TG_INF_D __longlong_as_double(0x7ff0000000000000LL)

// Rounds x to a binary format with `mant` explicit mantissa bits and exponents emin..emax
// (round to nearest even, subnormals, overflow to infinity), as an f32 value.
__device__ __forceinline__ float tg_round_fmt(double x, int mant, int emin, int emax) {
    if (isnan(x) || isinf(x) || x == 0.0) return (float)x;
    double ax = fabs(x);
    int e = ilogb(ax);
    if (e < emin) e = emin;
    double q = ldexp(1.0, e - mant);
    double r = rint(ax / q) * q;
    double maxv = ldexp(2.0 - ldexp(1.0, -mant), emax);
    if (r > maxv) r = TG_INF_D;
    return (float)copysign(r, x);
}
__device__ __forceinline__ float tg_f16(double x) { return tg_round_fmt(x, 10, -14, 15); }
__device__ __forceinline__ float tg_bf16(double x) { return tg_round_fmt(x, 7, -126, 127); }

// f16 storage bits <-> f32 values (exact: stored values are representable).
__device__ __forceinline__ float tg_h2f(u16 h) {
    u32 s = (h >> 15) & 1u, e = (h >> 10) & 31u, m = h & 1023u;
    float v;
    if (e == 0) v = ldexpf((float)m, -24);
    else if (e == 31) v = m ? TG_NAN_F : __int_as_float(0x7f800000);
    else v = ldexpf((float)(m + 1024u), (int)e - 25);
    return s ? -v : v;
}
__device__ __forceinline__ u16 tg_f2h(float v) {
    u32 b = __float_as_uint(v);
    u16 s = (u16)((b >> 16) & 0x8000u);
    float a = fabsf(v);
    if (isnan(v)) return (u16)(s | 0x7e00u);
    if (isinf(v)) return (u16)(s | 0x7c00u);
    if (a == 0.0f) return s;
    int e = ilogbf(a);
    if (e < -14) return (u16)(s | (u16)(a * 16777216.0f));
    u32 m = (u32)ldexpf(a, 10 - e) - 1024u;
    return (u16)(s | (u16)((e + 15) << 10) | (u16)m);
}
__device__ __forceinline__ float tg_bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }
__device__ __forceinline__ u16 tg_f2bf(float v) { return (u16)(__float_as_uint(v) >> 16); }

// Float to integer as Rust's `as`: truncate, saturate, NaN to 0.
__device__ __forceinline__ int tg_d2i32(double x) {
    if (isnan(x)) return 0;
    if (x <= -2147483648.0) return (int)0x80000000u;
    if (x >= 2147483647.0) return 0x7fffffff;
    return (int)x;
}
__device__ __forceinline__ i64 tg_d2i64(double x) {
    if (isnan(x)) return 0;
    if (x <= -9223372036854775808.0) return (i64)0x8000000000000000ULL;
    if (x >= 9223372036854775808.0) return 0x7fffffffffffffffLL;
    return (i64)x;
}

// Wrapping integer maths (C's signed overflow is undefined; Triton's wraps).
__device__ __forceinline__ int tg_add32(int a, int b) { return (int)((u32)a + (u32)b); }
__device__ __forceinline__ int tg_sub32(int a, int b) { return (int)((u32)a - (u32)b); }
__device__ __forceinline__ int tg_mul32(int a, int b) { return (int)((u32)a * (u32)b); }
__device__ __forceinline__ int tg_neg32(int a) { return (int)(0u - (u32)a); }
__device__ __forceinline__ int tg_abs32(int a) { return a < 0 ? tg_neg32(a) : a; }
__device__ __forceinline__ int tg_div32(int a, int b) { return b == -1 ? tg_neg32(a) : a / b; }
__device__ __forceinline__ int tg_rem32(int a, int b) { return b == -1 ? 0 : a % b; }
__device__ __forceinline__ i64 tg_add64(i64 a, i64 b) { return (i64)((u64)a + (u64)b); }
__device__ __forceinline__ i64 tg_sub64(i64 a, i64 b) { return (i64)((u64)a - (u64)b); }
__device__ __forceinline__ i64 tg_mul64(i64 a, i64 b) { return (i64)((u64)a * (u64)b); }
__device__ __forceinline__ i64 tg_neg64(i64 a) { return (i64)(0ULL - (u64)a); }
__device__ __forceinline__ i64 tg_abs64(i64 a) { return a < 0 ? tg_neg64(a) : a; }
__device__ __forceinline__ i64 tg_div64(i64 a, i64 b) { return b == -1 ? tg_neg64(a) : a / b; }
__device__ __forceinline__ i64 tg_rem64(i64 a, i64 b) { return b == -1 ? 0 : a % b; }

// Float min/max as the reference's (IEEE 754-2019 minimumNumber/maximumNumber): a NaN operand
// yields the other, and -0 < +0.
__device__ __forceinline__ float tg_minf(float a, float b) { return isnan(a) ? b : (isnan(b) ? a : (b < a || (b == a && signbit(b)) ? b : a)); }
__device__ __forceinline__ float tg_maxf(float a, float b) { return isnan(a) ? b : (isnan(b) ? a : (b > a || (b == a && signbit(a)) ? b : a)); }
__device__ __forceinline__ double tg_mind(double a, double b) { return isnan(a) ? b : (isnan(b) ? a : (b < a || (b == a && signbit(b)) ? b : a)); }
__device__ __forceinline__ double tg_maxd(double a, double b) { return isnan(a) ? b : (isnan(b) ? a : (b > a || (b == a && signbit(a)) ? b : a)); }

// Max and min reductions in any order, as the reference's in-order fold picks (with the
// reference's max and min): of (value, index) pairs, a number over a NaN, the last of NaNs, the
// greater (smaller) number, +0 over -0 (-0 over +0), the first of equal ones. The choice is
// associative, so a tree of picks gives the fold's. (Integers have no NaN and no signed zero.)
__device__ __forceinline__ bool tg_signbit(float x) { return signbit(x); }
__device__ __forceinline__ bool tg_signbit(double x) { return signbit(x); }
__device__ __forceinline__ bool tg_signbit(int x) { return x < 0; }
__device__ __forceinline__ bool tg_signbit(i64 x) { return x < 0; }
template <typename T, bool MAX> __device__ __forceinline__ void tg_pick(T& a, int& ia, T b, int ib) {
    const bool an = a != a, bn = b != b;
    bool take;
    if (an || bn) take = an && bn ? ib > ia : an;
    else if (MAX ? b > a : b < a) take = true;
    else if (MAX ? a > b : a < b) take = false;
    else if (tg_signbit(a) != tg_signbit(b)) take = MAX ? tg_signbit(a) : tg_signbit(b);
    else take = ib < ia;
    if (take) { a = b; ia = ib; }
}
// `tg_pick` where `b` comes after `a` in order (`ib > ia`): a thread's own elements, folded in
// order. The same choice with fewer tests: a NaN `a` gives way, else the strictly greater
// (smaller) `b` is taken, or +0 after -0 (-0 after +0).
template <typename T, bool MAX> __device__ __forceinline__ void tg_pick_next(T& a, int& ia, T b, int ib) {
    const bool zeros = b == a && tg_signbit(MAX ? a : b) && !tg_signbit(MAX ? b : a);
    if (a != a || (MAX ? b > a : b < a) || zeros) { a = b; ia = ib; }
}
// The `n` warps' partials (a power of two up to 32) folded by every warp, a tree of shuffles:
// lane `l` starts from partial `l % n`, so each group of `n` lanes holds them all and ends with
// the pick of them all. Every thread gets the result, in fewer steps and less code than folding
// the partials one after another.
template <typename T, bool MAX> __device__ __forceinline__ T tg_fold_warps(const T* p, const int* pi, int n) {
    const int w = (threadIdx.x % 32) % n;
    T a = p[w];
    int ia = pi[w];
    for (int s = n / 2; s >= 1; s /= 2) {
        const T ob = __shfl_xor_sync(0xffffffffu, a, s);
        const int oi = __shfl_xor_sync(0xffffffffu, ia, s);
        tg_pick<T, MAX>(a, ia, ob, oi);
    }
    return a;
}
template <typename T, bool MAX> __device__ __forceinline__ T tg_fold(const T* p, const int* pi, int n) {
    T a = p[0];
    int ia = pi[0];
    for (int w = 1; w < n; ++w) tg_pick<T, MAX>(a, ia, p[w], pi[w]);
    return a;
}

// tf32 operand rounding (10 mantissa bits, nearest even), as the reference's round_tf32.
__device__ __forceinline__ float tg_tf32(float x) {
    if (isnan(x) || isinf(x)) return x;
    u32 b = __float_as_uint(x);
    u32 lsb = (b >> 13) & 1u;
    return __uint_as_float((b + 0x0fffu + lsb) & ~0x1fffu);
}

// The reference's f32 exp (fastmath.rs): 2^f by a degree-9 polynomial in f64 with fused
// multiply-adds, scaled by 2^k, rounded once.
__device__ __forceinline__ float tg_exp32(float x) {
    double t = (double)x * TG_LOG2E;
    t = t < -200.0 ? -200.0 : (t > 200.0 ? 200.0 : t);
    double s = t + 6755399441055744.0;
    double k = s - 6755399441055744.0;
    double f = t - k;
    double p = TG_C9;
    p = fma(p, f, TG_C8); p = fma(p, f, TG_C7); p = fma(p, f, TG_C6); p = fma(p, f, TG_C5);
    p = fma(p, f, TG_C4); p = fma(p, f, TG_C3); p = fma(p, f, TG_C2); p = fma(p, f, TG_C1);
    p = fma(p, f, TG_C0);
    i64 ki = (i64)__double_as_longlong(s) - (i64)__double_as_longlong(6755399441055744.0);
    double scale = __longlong_as_double((i64)((u64)(ki + 1023) << 52));
    float r = (float)(p * scale);
    return isnan(x) ? x : r;
}
__device__ __forceinline__ float tg_sigmoid32(float x) { return 1.0f / (1.0f + tg_exp32(-x)); }
__device__ __forceinline__ double tg_sigmoid64(double x) { return 1.0 / (1.0 + exp(-x)); }

// Race marks: a reader or atomic updater per element (program + 1, or TG_MANY).
__device__ __forceinline__ void tg_mark(u32* m, u32 me) {
    u32 o = atomicCAS(m, 0u, me);
    if (o != 0u && o != me && o != TG_MANY) atomicExch(m, TG_MANY);
}

// After a launch: an element some program stores (or updates atomically) that another program
// also reads or writes. Any such conflict sends the launch to the reference, which reports it.
// `w` holds the stores' stamps: 64 bits `(program + 1) << 32 | count` where `wide`, else 32
// bits `(program + 1) << 8 | count`.
extern "C" __global__ void tg_races(const void* w, int wide, const u32* r, const u32* a, i64 n, u32* flags) {
    for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
        u32 wp = !w ? 0u : wide ? (u32)(((const u64*)w)[e] >> 32) : ((const u32*)w)[e] >> 8;
        u32 rp = r ? r[e] : 0u;
        u32 ap = a ? a[e] : 0u;
        bool bad = (wp && rp && (rp == TG_MANY || rp != wp)) || (ap && (wp || rp));
        if (bad) atomicOr(flags, 1u);
    }
}
