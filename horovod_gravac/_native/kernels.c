/* Native CPU kernels of horovod_gravac's sparsifiers (loaded with ctypes by
 * horovod_gravac/native.py; every entry point has a NumPy twin that gives the same
 * result, used when this library is missing or HOROVOD_GRAVAC_NATIVE=0).
 *
 * Why native: selecting the entries with |x| >= t out of 25M float32 costs NumPy a
 * compare, a mask, a nonzero and a gather (about 40 ms at 10 % density on one core),
 * while one fused pass that compacts survivors as it streams costs 6 ms with AVX-512
 * (one pass reads 100 MB: the compaction is nearly free).
 *
 * Magnitudes are compared as the bit patterns of |x|: for non-negative floats the
 * unsigned integer order is the numeric order, and every NaN is mapped to one key
 * above +inf, so NaN ranks as larger than any number (as torch.topk does).
 *
 * Plain C99 with GCC/Clang builtins; the AVX-512 path is compiled for that target
 * only and chosen at run time, so one build runs on any x86-64 (and the portable
 * path on any other architecture).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HG_X86 1
#include <immintrin.h>
#endif

#define HG_NAN_KEY 0x7F800001u /* every NaN: just above +inf (0x7F800000) */

static inline uint32_t hg_key(float v) {
    uint32_t b;
    memcpy(&b, &v, sizeof b);
    b &= 0x7FFFFFFFu;
    return b > 0x7F800000u ? HG_NAN_KEY : b;
}

/* -- select: the entries with |x| >= t (or > t) ------------------------------------- */

/* The compare needs no NaN mapping: the bits of |NaN| exceed those of +inf, so a NaN
 * passes any threshold key up to HG_NAN_KEY (hg_key(t) never exceeds it).
 *
 * Portable path: blocks of 32.  A block's largest key (a reduction the compiler
 * vectorises with whatever SIMD the target has) tells whether anything in it passes;
 * most blocks are skipped at high CFs.  Blocks with survivors are compacted without
 * branches: every entry is stored, the output advances only past survivors. */
#define HG_BLOCK 32
#if defined(HG_X86) && defined(__GNUC__) && !defined(__clang__)
/* x86 without AVX-512 (AMD Zen 2/3, client cores): an AVX2 clone, picked at load time */
#define HG_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define HG_CLONES
#endif
#define SELECT_PORTABLE(NAME, KEEP)                                                              \
    HG_CLONES static int64_t NAME(const float *x, int64_t n, int64_t start, uint32_t tkey, int32_t *idx,    \
                        float *val, int64_t cap) {                                                \
        const uint32_t *bits = (const uint32_t *)(const void *)x;                                \
        int64_t c = 0, i = start;                                                                 \
        for (; i + HG_BLOCK <= n && c + HG_BLOCK <= cap; i += HG_BLOCK) {                         \
            uint32_t top = 0;                                                                     \
            for (int j = 0; j < HG_BLOCK; j++) {                                                  \
                uint32_t b = bits[i + j] & 0x7FFFFFFFu;                                           \
                top = b > top ? b : top;                                                          \
            }                                                                                     \
            uint32_t b = top;                                                                     \
            if (!(KEEP)) continue;                                                                \
            for (int j = 0; j < HG_BLOCK; j++) {                                                  \
                b = bits[i + j] & 0x7FFFFFFFu;                                                    \
                idx[c] = (int32_t)(i + j);                                                        \
                val[c] = x[i + j];                                                                \
                c += (KEEP);                                                                      \
            }                                                                                     \
        }                                                                                         \
        for (; i < n; i++) { /* the rest; only counted once the buffer is full */                 \
            uint32_t b = bits[i] & 0x7FFFFFFFu;                                                   \
            if (c < cap) {                                                                        \
                idx[c] = (int32_t)i;                                                              \
                val[c] = x[i];                                                                    \
            }                                                                                     \
            c += (KEEP);                                                                          \
        }                                                                                         \
        return c;                                                                                 \
    }
SELECT_PORTABLE(select_portable_ge, b >= tkey)
SELECT_PORTABLE(select_portable_gt, b > tkey)

#ifdef HG_X86
#define HG_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,popcnt")))

/* AVX-512, 16 entries per step from x + start, which must be 64-byte aligned (loads
 * that straddle two cache lines made the pass 1.3-1.4x slower: benchmarks/select_floor.c).
 * Survivors are compacted inside a register and stored
 * as a whole vector (lanes past the survivors are overwritten by the next store):
 * much faster than a compress-store to memory, which is microcoded on AMD cores.
 * `dense`: store every step without testing the mask, which beats a branch that is
 * mispredicted once survivors are more than about 1 in 200 (hg_select).  Needs 16 slots of slack
 * after cap.  Returns the count; *stopped: where it stopped (the caller finishes). */
HG_AVX512 static int64_t select_avx512(const float *x, int64_t n, int64_t start, uint32_t tkey, int strict,
                                       int dense, int32_t *idx, float *val, int64_t cap, int64_t *stopped) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
    const __m512i t = _mm512_set1_epi32((int)tkey);
    const __m512i sixteen = _mm512_set1_epi32(16);
    __m512i iv = _mm512_add_epi32(_mm512_set1_epi32((int)start),
                                  _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    int64_t c = 0, i = start;
#define HG_STEP(CMP, TEST)                                                                          \
    {                                                                                               \
        __m512i v = _mm512_load_si512((const void *)(x + i));                                      \
        __mmask16 m = CMP(_mm512_and_si512(v, abs_mask), t);                                        \
        if (TEST) {                                                                                 \
            _mm512_storeu_si512((void *)(val + c), _mm512_maskz_compress_epi32(m, v));              \
            _mm512_storeu_si512((void *)(idx + c), _mm512_maskz_compress_epi32(m, iv));             \
            c += __builtin_popcount((unsigned)m);                                                   \
        }                                                                                           \
        iv = _mm512_add_epi32(iv, sixteen);                                                         \
    }
    /* four copies of one loop: the compare needs a constant predicate */
    if (strict && dense)
        for (; i + 16 <= n && c + 16 <= cap; i += 16) HG_STEP(_mm512_cmpgt_epu32_mask, 1)
    else if (strict)
        for (; i + 16 <= n && c + 16 <= cap; i += 16) HG_STEP(_mm512_cmpgt_epu32_mask, m)
    else if (dense)
        for (; i + 16 <= n && c + 16 <= cap; i += 16) HG_STEP(_mm512_cmpge_epu32_mask, 1)
    else
        for (; i + 16 <= n && c + 16 <= cap; i += 16) HG_STEP(_mm512_cmpge_epu32_mask, m)
#undef HG_STEP
    *stopped = i;
    return c;
}

/* AVX2 (x86 without AVX-512, e.g. AMD Zen), 8 entries per step, unaligned loads:
 * survivors are packed to the front of the register by a permutation looked up from the
 * 8-bit compare mask, and stored as a whole vector (lanes past the survivors are
 * overwritten by the next store).  The portable C loop cannot be vectorised by the
 * compiler (the output position depends on the previous step) and costs 3-4x more at
 * CF 10.  Magnitude keys are below 2^31, so the signed compare orders them; >= t is
 * > t - 1 (for t = 0 that is > -1: everything).  `dense` (see hg_select for the density):
 * store every step; otherwise skip blocks of 32 without survivors.  On a Zen 1 core, 1M
 * entries in cache: dense 0.40 ms at any density, blocks 0.14 / 0.31 / 0.42 ms at
 * 0.1 / 1 / 10 %, a loop with one branch per 8 entries 0.15 / 0.27 / 0.89 ms (a
 * t.abs().max() without its allocation: 0.08 ms). */
#define HG_AVX2 __attribute__((target("avx2,popcnt")))
static int32_t hg_lut[256][8] __attribute__((aligned(32)));

static void hg_lut_init(void) {
    static int ready;
    if (ready) return;
    for (int m = 0; m < 256; m++) {
        int j = 0;
        for (int b = 0; b < 8; b++)
            if ((m >> b) & 1) hg_lut[m][j++] = b;
        for (; j < 8; j++) hg_lut[m][j] = 0;
    }
    ready = 1;
}

HG_AVX2 static int64_t select_avx2(const float *x, int64_t n, int64_t start, uint32_t tkey, int strict,
                                   int dense, int32_t *idx, float *val, int64_t cap, int64_t *stopped) {
    const __m256i abs_mask = _mm256_set1_epi32(0x7FFFFFFF);
    const __m256i t = _mm256_set1_epi32((int)(strict ? tkey : tkey - 1u));
    const __m256i eight = _mm256_set1_epi32(8);
    int64_t c = 0, i = start;
#define HG_CMP8(V) _mm256_cmpgt_epi32(_mm256_and_si256((V), abs_mask), t)
#define HG_MASK8(G) ((unsigned)_mm256_movemask_ps(_mm256_castsi256_ps(G)))
#define HG_EMIT8(V, IV, M)                                                                          \
    {                                                                                               \
        __m256i perm = _mm256_load_si256((const __m256i *)(const void *)hg_lut[(M)]);              \
        _mm256_storeu_si256((__m256i *)(void *)(val + c), _mm256_permutevar8x32_epi32((V), perm)); \
        _mm256_storeu_si256((__m256i *)(void *)(idx + c), _mm256_permutevar8x32_epi32((IV), perm)); \
        c += __builtin_popcount(M);                                                                 \
    }
    if (dense) {
        __m256i iv = _mm256_add_epi32(_mm256_set1_epi32((int)start), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        for (; i + 8 <= n && c + 8 <= cap; i += 8) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(x + i));
            unsigned m = HG_MASK8(HG_CMP8(v));
            HG_EMIT8(v, iv, m)
            iv = _mm256_add_epi32(iv, eight);
        }
    } else {
        /* Blocks of 32: one branch per block on the OR of four compares, so a block
         * without survivors costs four loads and compares (most blocks at high CFs),
         * and the branch is mispredicted at most once per 32 entries rather than per 8. */
        for (; i + 32 <= n && c + 32 <= cap; i += 32) {
            __m256i v0 = _mm256_loadu_si256((const __m256i *)(const void *)(x + i));
            __m256i v1 = _mm256_loadu_si256((const __m256i *)(const void *)(x + i + 8));
            __m256i v2 = _mm256_loadu_si256((const __m256i *)(const void *)(x + i + 16));
            __m256i v3 = _mm256_loadu_si256((const __m256i *)(const void *)(x + i + 24));
            __m256i g0 = HG_CMP8(v0), g1 = HG_CMP8(v1), g2 = HG_CMP8(v2), g3 = HG_CMP8(v3);
            __m256i any = _mm256_or_si256(_mm256_or_si256(g0, g1), _mm256_or_si256(g2, g3));
            if (_mm256_testz_si256(any, any)) continue;
            __m256i iv = _mm256_add_epi32(_mm256_set1_epi32((int)i), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            unsigned m0 = HG_MASK8(g0), m1 = HG_MASK8(g1), m2 = HG_MASK8(g2), m3 = HG_MASK8(g3);
            HG_EMIT8(v0, iv, m0)
            iv = _mm256_add_epi32(iv, eight);
            HG_EMIT8(v1, iv, m1)
            iv = _mm256_add_epi32(iv, eight);
            HG_EMIT8(v2, iv, m2)
            iv = _mm256_add_epi32(iv, eight);
            HG_EMIT8(v3, iv, m3)
        }
    }
#undef HG_CMP8
#undef HG_MASK8
#undef HG_EMIT8
    *stopped = i;
    return c;
}

static int hg_has_avx2(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        int h = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt");
        if (h) hg_lut_init(); /* before `has` says so: another thread may use the table right after */
        __atomic_store_n(&has, h, __ATOMIC_RELEASE);
    }
    return has;
}

static int hg_has_avx512(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("popcnt");
    }
    return has;
}
#endif

/* Which code path the kernels take: 2 = AVX-512, 3 = AVX2 (the select pass only), 1 = portable.
 * allow_simd (every entry point's last argument): 0 = portable C only, 1 = the best the CPU
 * has, 2 = AVX2 at most, which is what x86 without AVX-512 (AMD Zen 2/3) runs: an AVX-512
 * machine can then test and time that code too. */
int hg_simd_level(int allow_simd) {
#ifdef HG_X86
    if (allow_simd == 1 && hg_has_avx512()) return 2;
    if (allow_simd && hg_has_avx2()) return 3;
#endif
    (void)allow_simd;
    return 1;
}

/* Flat indices (ascending) and signed values of the entries of x[0:n] whose
 * magnitude is >= t (> t when strict); NaN entries always pass.  Writes at most cap
 * entries to idx and val (each needs cap + 16 slots) and returns the full count, so a
 * caller whose buffer was too small knows the size to retry with.  `density`: the
 * expected fraction of survivors (chooses between two equivalent loops). */
int64_t hg_select(const float *x, int64_t n, float t, int strict, double density,
                  int32_t *idx, float *val, int64_t cap, int allow_simd) {
    uint32_t tkey = hg_key(t);
    int64_t c = 0, start = 0;
#ifdef HG_X86
    if (hg_simd_level(allow_simd) == 2) {
        /* the entries before the first 64-byte boundary in portable C, the rest vectorised */
        int64_t head = (int64_t)((64u - ((uintptr_t)x & 63u)) & 63u) / (int64_t)sizeof(float);
        if (((uintptr_t)x & 3u) != 0 || head > n) head = n; /* unaligned floats: all portable */
        c = strict ? select_portable_gt(x, head, 0, tkey, idx, val, cap)
                   : select_portable_ge(x, head, 0, tkey, idx, val, cap);
        start = head;
        if (head < n) {
            int64_t room = cap > c ? cap - c : 0;
            /* the store-every-step loop from 0.5 % expected survivors (1 % past 8M entries, out of
             * cache, where its stores cost memory traffic): the branch of the other loop is then
             * mispredicted often enough to cost more, up to 2.4x at 1-3 % (a switch at 2 % would send
             * Top-k at CF 100-200 down the slow loop) */
            int dense = density > (n > ((int64_t)8 << 20) ? 0.01 : 0.005);
            c += select_avx512(x, n, head, tkey, strict, dense, idx + c, val + c, room, &start);
        }
    } else if (hg_simd_level(allow_simd) == 3) {
        /* the store-every-step loop from 1.2 % expected survivors up to 2M entries, 0.6 % up to 8M
         * and 2 % past that (out of cache): where the two loops cross on an Intel Xeon running these
         * AVX2 loops; a switch at 4 % cost up to 1.5x at 1-3 %, where SIDCo gathers at CF 100.  Zen 1, which splits 256-bit
         * operations in two, favoured the block loop up to ~5 % (the figures above select_avx2);
         * Zen 2 onwards does not split them. */
        int dense = density > (n > ((int64_t)8 << 20) ? 0.02 : n > ((int64_t)2 << 20) ? 0.006 : 0.012);
        c = select_avx2(x, n, 0, tkey, strict, dense, idx, val, cap, &start);
    }
#endif
    (void)density;
    if (start < n) { /* the tail, or everything on the portable path */
        int64_t room = cap > c ? cap - c : 0;
        c += strict ? select_portable_gt(x, n, start, tkey, idx + c, val + c, room)
                    : select_portable_ge(x, n, start, tkey, idx + c, val + c, room);
    }
    return c;
}

/* -- scatter: the dense tensor of a sparse payload ------------------------------------ */

/* out[0:n] = 0, then out[idx[j]] = val[j] for j < k.  Returns 0, or -1 (out untouched
 * after the zeroing) when an index is outside [0, n): a payload that does not belong to
 * this tensor must not write past it.  torch's index_put_ costs about 10 ns per entry on
 * one core (1.2 ms for 100k entries); this loop about 1. */
int hg_scatter(float *out, int64_t n, const int32_t *idx, const float *val, int64_t k) {
    for (int64_t j = 0; j < k; j++)
        if (idx[j] < 0 || (int64_t)idx[j] >= n) return -1;
    memset(out, 0, (size_t)n * sizeof(float));
    for (int64_t j = 0; j < k; j++) out[idx[j]] = val[j];
    return 0;
}

/* -- drop: keep the k largest of c candidates ----------------------------------------- */

/* The e-th smallest (1-based) of keys[0:m], by radix select on 11-bit digits starting
 * at the highest bit where the keys differ; *below gets how many keys are smaller and
 * *equal how many equal it.  keys is only read. */
static uint32_t radix_select(const uint32_t *keys, int64_t m, int64_t e, int64_t *below, int64_t *equal) {
    uint32_t lo = keys[0], hi = keys[0];
    for (int64_t j = 1; j < m; j++) {
        lo = keys[j] < lo ? keys[j] : lo;
        hi = keys[j] > hi ? keys[j] : hi;
    }
    int64_t acc = 0;
    uint32_t prefix = 0, prefix_mask = 0;
    if (lo == hi) {
        *below = 0;
        *equal = m;
        return lo;
    }
    int shift = 32 - __builtin_clz(lo ^ hi); /* bits below this may differ */
    prefix = lo & ~((shift >= 32) ? 0u : ((1u << shift) - 1u));
    prefix_mask = shift >= 32 ? 0u : ~((1u << shift) - 1u);
    uint32_t hist[2048];
    while (shift > 0) {
        int width = shift < 11 ? shift : 11;
        shift -= width;
        uint32_t digit_mask = (1u << width) - 1u;
        memset(hist, 0, sizeof(uint32_t) << width);
        for (int64_t j = 0; j < m; j++)
            if ((keys[j] & prefix_mask) == prefix) hist[(keys[j] >> shift) & digit_mask]++;
        uint32_t d = 0;
        for (;; d++) {
            if (acc + hist[d] >= e) break;
            acc += hist[d];
        }
        prefix |= d << shift;
        prefix_mask |= digit_mask << shift;
        *equal = hist[d];   /* after the last digit: the keys equal to the result */
    }
    *below = acc;
    return prefix;
}

#ifdef HG_X86
/* positions j < c with key(val[j]) < lkey, and their keys; returns how many */
HG_AVX512 static int64_t below_avx512(const float *val, int64_t c, uint32_t lkey, int32_t *pos, uint32_t *keys,
                                      int64_t *stopped) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
    const __m512i inf_key = _mm512_set1_epi32(0x7F800000);
    const __m512i nan_key = _mm512_set1_epi32((int)HG_NAN_KEY);
    const __m512i l = _mm512_set1_epi32((int)lkey);
    const __m512i sixteen = _mm512_set1_epi32(16);
    __m512i jv = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    int64_t m = 0, j = 0;
    for (; j + 16 <= c; j += 16) {
        __m512i key = _mm512_and_si512(_mm512_loadu_si512((const void *)(val + j)), abs_mask);
        key = _mm512_mask_mov_epi32(key, _mm512_cmpgt_epu32_mask(key, inf_key), nan_key);
        __mmask16 b = _mm512_cmplt_epu32_mask(key, l);
        _mm512_storeu_si512((void *)(pos + m), _mm512_maskz_compress_epi32(b, jv));
        _mm512_storeu_si512((void *)(keys + m), _mm512_maskz_compress_epi32(b, key));
        m += __builtin_popcount((unsigned)b);
        jv = _mm512_add_epi32(jv, sixteen);
    }
    *stopped = j;
    return m;
}
#endif

/* Per-thread scratch for the drop, kept between calls: a fresh allocation of this
 * size is mapped anew by malloc and pays a page fault per 4 KiB touched, which costs
 * more than the work.  Holds 8 bytes per candidate of the largest call so far. */
static __thread int32_t *scratch_pos;
static __thread uint32_t *scratch_keys;
static __thread int64_t scratch_size;

static int scratch(int64_t size, int32_t **pos, uint32_t **keys) {
    if (size > scratch_size) {
        free(scratch_pos);
        free(scratch_keys);
        scratch_pos = (int32_t *)malloc(sizeof(int32_t) * (size_t)size);
        scratch_keys = (uint32_t *)malloc(sizeof(uint32_t) * (size_t)size);
        if (!scratch_pos || !scratch_keys) {
            free(scratch_pos);
            free(scratch_keys);
            scratch_pos = NULL;
            scratch_keys = NULL;
            scratch_size = 0;
            return -1;
        }
        scratch_size = size;
    }
    *pos = scratch_pos;
    *keys = scratch_keys;
    return 0;
}

/* pos[0..nd) lists the dropped candidates' slots, ascending, and exactly c - nd survive.
 * Refill the dropped slots below `kept` = c - nd, in order, with the survivors after
 * position `kept`, so the first `kept` slots hold every survivor. */
static void fill_dropped(int32_t *idx, float *val, const int32_t *pos, int64_t nd, int64_t kept) {
    int64_t holes = 0;
    while (holes < nd && pos[holes] < kept) holes++;
    int64_t t = holes, src = kept;
    for (int64_t h = 0; h < holes; h++, src++) {
        while (t < nd && pos[t] == src) {
            t++;
            src++;
        }
        idx[pos[h]] = idx[src];
        val[pos[h]] = val[src];
    }
}

/* Keep the k candidates of largest magnitude out of c (idx/val in ascending flat
 * index order), in place in the first k slots: among candidates tied at the k-th
 * magnitude the lowest flat indices stay.  Dropped slots among the first k are
 * refilled, in order, by the survivors after position k, so the result is ascending
 * except at the refilled slots.
 *
 * lower_than: a magnitude expected to lie above the c - k smallest candidates (the
 * search then looks only at candidates below it, and at all when it was wrong);
 * use_lower = 0 searches all.  Returns 0, or -1 when out of memory. */
int hg_drop_smallest(int32_t *idx, float *val, int64_t c, int64_t k, float lower_than, int use_lower,
                     int allow_simd) {
    int64_t e = c - k;
    if (e <= 0) return 0;
    int32_t *pos;
    uint32_t *keys;
    if (scratch(c + 16, &pos, &keys) != 0) return -1;
    uint32_t lkey = use_lower ? hg_key(lower_than) : 0xFFFFFFFFu;
    int64_t m = 0, j = 0;
    for (int pass = 0; pass < 2; pass++) {
        m = 0;
        j = 0;
#ifdef HG_X86
        if (hg_simd_level(allow_simd) == 2) m = below_avx512(val, c, lkey, pos, keys, &j);
#endif
        (void)allow_simd;
        for (; j < c; j++) {
            uint32_t key = hg_key(val[j]);
            pos[m] = (int32_t)j;
            keys[m] = key;
            m += key < lkey;
        }
        if (m >= e) break;
        lkey = 0xFFFFFFFFu; /* the bound was too low: search all */
    }
    int64_t below, ties;
    uint32_t v = radix_select(keys, m, e, &below, &ties);
    /* ties at v: the first (ties - (e - below)) stay, the later ones are dropped */
    int64_t keep_ties = ties - (e - below), seen = 0, nd = 0;
    for (j = 0; j < m; j++) { /* branchless (the test is a coin flip); pos stays ascending */
        int tie = keys[j] == v;
        int drop = (keys[j] < v) | (tie & (seen >= keep_ties));
        seen += tie;
        pos[nd] = pos[j];
        nd += drop;
    }
    fill_dropped(idx, val, pos, nd, k);   /* nd == e */
    return 0;
}

/* -- RedSync's threshold search over candidates ---------------------------------------- */

/* Per-thread scratch of the search, kept between calls for the same reason as the drop's:
 * the positions and magnitudes of the candidates at or below the bracket's upper end. */
static __thread int32_t *rs_pos;
static __thread float *rs_mag;
static __thread int64_t rs_size;

static int rs_scratch(int64_t size) {
    if (size > rs_size) {
        free(rs_pos);
        free(rs_mag);
        rs_pos = (int32_t *)malloc(sizeof(int32_t) * (size_t)size);
        rs_mag = (float *)malloc(sizeof(float) * (size_t)size);
        if (!rs_pos || !rs_mag) {
            free(rs_pos);
            free(rs_mag);
            rs_pos = NULL;
            rs_mag = NULL;
            rs_size = 0;
            return -1;
        }
        rs_size = size;
    }
    return 0;
}

/* #(mag[j] > mid) for j < r: a compare and an add per entry, which the compiler vectorises
 * (NaN is never counted). */
HG_CLONES static int64_t count_above(const float *mag, int64_t r, float mid) {
    int64_t cnt = 0;
    for (int64_t j = 0; j < r; j++) cnt += mag[j] > mid;
    return cnt;
}

#ifdef HG_X86
/* The first loop of hg_redsync in AVX2, 8 candidates per step (the scalar loop finishes the
 * last c mod 8): max |v|, the count above ceil, and the positions and magnitudes of the others
 * packed to the front of a register through hg_lut and stored whole (8 slots of slack).
 * _mm256_max_ps(a, m) is a > m ? a : m, as the scalar loop, so a NaN never becomes the max.
 * Returns where it stopped. */
HG_AVX2 static int64_t record_avx2(const float *val, int64_t c, float ceil_, int32_t *pos, float *mag,
                                   int64_t *r_out, int64_t *above_out, float *vmax_out) {
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    const __m256 cv = _mm256_set1_ps(ceil_);
    const __m256i eight = _mm256_set1_epi32(8);
    __m256i iv = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 vmax = _mm256_setzero_ps();
    int64_t r = 0, above = 0, j = 0;
    for (; j + 8 <= c; j += 8) {
        __m256 a = _mm256_and_ps(_mm256_loadu_ps(val + j), abs_mask);
        vmax = _mm256_max_ps(a, vmax);
        unsigned up = (unsigned)_mm256_movemask_ps(_mm256_cmp_ps(a, cv, _CMP_GT_OQ));
        unsigned keep = ~up & 0xFFu;
        above += __builtin_popcount(up);
        __m256i perm = _mm256_load_si256((const __m256i *)(const void *)hg_lut[keep]);
        _mm256_storeu_si256((__m256i *)(void *)(pos + r), _mm256_permutevar8x32_epi32(iv, perm));
        _mm256_storeu_ps(mag + r, _mm256_permutevar8x32_ps(a, perm));
        r += __builtin_popcount(keep);
        iv = _mm256_add_epi32(iv, eight);
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, vmax);
    float m = 0.0f;
    for (int l = 0; l < 8; l++) m = lanes[l] > m ? lanes[l] : m;
    *r_out = r;
    *above_out = above;
    *vmax_out = m;
    return j;
}
#endif

/* RedSync's binary search (horovod_gravac/selection/redsync.py, redsync_search) over the
 * magnitudes of c candidates (idx/val: flat indices and signed values), then the ones with
 * |v| <= threshold dropped in place.  Each step counts exactly what redsync_search counts,
 * #(|v| > mid) with mid = (lo + hi) / 2 in float32, and moves the same way (too few:
 * hi = mid; too many: lo = mid; within [few, many]: done, lo = hi = mid).  The candidates
 * above the bracket's upper end are counted once; each step then counts, in one vectorised
 * pass, only the magnitudes recorded at or below it (mid never leaves the bracket, so the
 * others are on the same side of every mid).  Narrowing that set step by step instead (a
 * compaction per step, which does not vectorise) cost more than counting it whole; and only
 * the recorded candidates can be dropped, so only they are revisited.
 *
 * ceil: the sampled upper end; the search runs on [lo, min(max |v|, ceil)], or on
 * [lo, max |v|] when more than `many` lie above ceil (as redsync.py does).  NaN
 * candidates are never counted and always dropped (|NaN| > mid is false).
 * Dropped slots among the first `kept` are refilled, in order, by the survivors after
 * them (as hg_drop_smallest does): ascending except at the refilled slots.
 * out[0] = the threshold (lo), out[1] = hi, out[2] = steps taken.
 * Returns the kept count, or -1 when out of memory. */
int64_t hg_redsync(int32_t *idx, float *val, int64_t c, float lo, float ceil_, double few, double many,
                   int steps, double *out, int allow_simd) {
    if (rs_scratch(c + 16) != 0) return -1;
    int32_t *pos = rs_pos;
    float *mag = rs_mag;
    float vmax = 0.0f;
    int64_t above = 0, r = 0, j = 0;
#ifdef HG_X86
    if (allow_simd && hg_has_avx2()) j = record_avx2(val, c, ceil_, pos, mag, &r, &above, &vmax);
#endif
    (void)allow_simd;
    for (; j < c; j++) { /* max, count above ceil, the others recorded */
        float a = fabsf(val[j]);
        vmax = a > vmax ? a : vmax;
        int up = a > ceil_;
        above += up;
        pos[r] = (int32_t)j;
        mag[r] = a;
        r += !up;
    }
    float hi = vmax < ceil_ ? vmax : ceil_;
    if ((double)above > many) { /* the sampled upper end keeps too many: search up to max */
        hi = vmax;
        r = 0;
        for (int64_t j = 0; j < c; j++) {
            pos[r] = (int32_t)j;
            mag[r] = fabsf(val[j]);
            r++;
        }
        above = 0;
    } else if (hi < ceil_) {
        above = 0; /* hi = vmax: nothing lies above it */
    }
    if (lo > hi) lo = hi;
    /* from here on every recorded magnitude is <= hi and every other one > hi */
    int taken = 0;
    for (; taken < steps; taken++) {
        float mid = (lo + hi) * 0.5f;
        double count = (double)(above + count_above(mag, r, mid));
        if (count < few) { /* too few kept: lower the threshold */
            hi = mid;
        } else if (count > many) { /* too many: raise it */
            lo = mid;
        } else { /* within tolerance: done (later steps would leave lo = hi = mid) */
            lo = hi = mid;
            taken++;
            break;
        }
    }
    out[0] = lo;
    out[1] = hi;
    out[2] = taken;
    /* the dropped: recorded candidates with !(|v| > lo), ascending */
    int64_t nd = 0;
    for (int64_t j = 0; j < r; j++) {
        pos[nd] = pos[j];
        nd += !(mag[j] > lo);
    }
    int64_t kept = c - nd;
    fill_dropped(idx, val, pos, nd, kept);
    return kept;
}

/* -- the stratified sample ------------------------------------------------------------------- */

/* out[i] = |x[i d + min(floor(d f_i), d - 1)]| for i < s, with d = n / s and
 * f_i = frac(i phi) + u, less 1 when that reaches 1: the positions of
 * horovod_gravac/selection/sampling.py (host_abs_sample), in the same double arithmetic, so
 * both give the same sample.  Contraction into fused multiply-adds would change the rounding
 * of frac(i phi), hence it is off.  In NumPy the positions cost eight array operations, about
 * as much as the selection pass of a 256K-entry bucket. */
#if defined(__GNUC__) && !defined(__clang__)
#define HG_SAMPLE_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define HG_SAMPLE_NO_CONTRACT
#endif
#ifdef HG_X86
static int hg_has_avx512dq(void) {
    static int has = -1;
    if (has < 0) {
        __builtin_cpu_init();
        has = hg_has_avx512() && __builtin_cpu_supports("avx512dq");
    }
    return has;
}

/* Eight positions a step, each computed as the scalar loop below computes it (the same IEEE
 * operations on each lane: the truncation is a round toward zero, the casts are exact), and the
 * eight magnitudes gathered.  The scalar loop's double-to-integer conversions and its branch made
 * SIDCo's 8192-entry sample cost 29 us at 1M entries against 19 us this way, and 22 against 9 us
 * at 262K (measured with a fresh shift per call, as in use: with one shift repeated, the scalar
 * loop's reads stay in cache and it looks faster than it is).
 * Returns how many it did (a multiple of 8). */
__attribute__((target("avx512f,avx512dq"))) HG_SAMPLE_NO_CONTRACT
static int64_t abs_sample_avx512(const float *x, int64_t s, int64_t d, double u, double phi, float *out) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    const __m512d vphi = _mm512_set1_pd(phi), vu = _mm512_set1_pd(u), one = _mm512_set1_pd(1.0);
    const __m512d vd = _mm512_set1_pd((double)d);
    const __m512i last = _mm512_set1_epi64(d - 1), stride = _mm512_set1_epi64(d), eight = _mm512_set1_epi64(8);
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
    __m512i iv = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7);
    int64_t i = 0;
    for (; i + 8 <= s; i += 8) {
        __m512d p = _mm512_mul_pd(_mm512_cvtepi64_pd(iv), vphi);
        __m512d f = _mm512_add_pd(_mm512_sub_pd(p, _mm512_roundscale_pd(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC)), vu);
        f = _mm512_mask_sub_pd(f, _mm512_cmp_pd_mask(f, one, _CMP_GE_OQ), f, one);
        __m512i pos = _mm512_min_epi64(_mm512_cvttpd_epi64(_mm512_mul_pd(f, vd)), last);
        __m512i at = _mm512_add_epi64(_mm512_mullo_epi64(iv, stride), pos);
        _mm256_storeu_ps(out + i, _mm256_and_ps(_mm512_i64gather_ps(at, x, 4), abs_mask));
        iv = _mm512_add_epi64(iv, eight);
    }
    return i;
}
#endif

HG_SAMPLE_NO_CONTRACT
void hg_abs_sample(const float *x, int64_t n, int64_t s, double u, double phi, float *out, int allow_simd) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    int64_t d = n / s, i = 0;
#ifdef HG_X86
    if (allow_simd == 1 && hg_has_avx512dq()) i = abs_sample_avx512(x, s, d, u, phi, out);
#endif
    (void)allow_simd;
    for (; i < s; i++) {
        double p = (double)i * phi;                 /* 0 <= p < 2^53: the cast truncates exactly */
        double f = (p - (double)(int64_t)p) + u;    /* (trunc() is a libm call on baseline x86-64) */
        if (f >= 1.0) f -= 1.0;
        int64_t pos = (int64_t)(f * (double)d);
        if (pos > d - 1) pos = d - 1;
        out[i] = fabsf(x[i * d + pos]);
    }
}

/* -- SIDCo's statistics pass -------------------------------------------------------------- */

/* out = [m, sum w, sum w^2] of the excesses w = |x| - t over |x| > t (NaN left out): one
 * streaming pass, the fit of one SIDCo stage.  Sums in float per block of 4096 entries
 * (exact enough: the blocks are added in double), reassociated within a block so that the
 * compiler vectorises them (without that the three dependent float adds cost ~60x more). */
#if defined(__GNUC__) && !defined(__clang__)
#define HG_REASSOC __attribute__((optimize("associative-math", "no-signed-zeros", "no-trapping-math")))
#else
#define HG_REASSOC
#endif
HG_CLONES HG_REASSOC void hg_exceedance_moments(const float *x, int64_t n, float t, int squares, double *out) {
#if defined(__clang__)
#pragma clang fp reassociate(on)
#endif
    double cnt = 0.0, s1 = 0.0, s2 = 0.0;
    for (int64_t start = 0; start < n; start += 4096) {
        int64_t end = start + 4096 < n ? start + 4096 : n;
        float c = 0.0f, a1 = 0.0f, a2 = 0.0f;
        for (int64_t i = start; i < end; i++) {
            float w = fabsf(x[i]) - t;
            w = w > 0.0f ? w : 0.0f; /* NaN: 0 */
            c += w > 0.0f ? 1.0f : 0.0f;
            a1 += w;
            a2 += w * w;
        }
        cnt += c;
        s1 += a1;
        s2 += a2;
    }
    out[0] = cnt;
    out[1] = s1;
    out[2] = squares ? s2 : 0.0;
}

/* -- SIDCo's gamma fit: the upper quantile of a standard gamma -------------------------------- */

/* fits.gamma_upper_quantile_host, operation for operation, so that both give the same double:
 * the Python version evaluates Q(a, x) in a Python loop, 7 times a call, which cost 10-40 us,
 * a tenth of SIDCo gamma's whole compress at 1M entries.  The values Python computes with its
 * own code (lgamma, the normal quantile) come in as arguments; log, exp, log1p and sqrt are
 * the C library's, as in CPython.  No FMA contraction (it would round differently), and
 * Python's min/max (the first argument unless the second is strictly beyond it). */
#if defined(__GNUC__) && !defined(__clang__)
#define HG_NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define HG_NO_CONTRACT
#endif
static inline double hg_pymax(double a, double b) { return b > a ? b : a; }
static inline double hg_pymin(double a, double b) { return b < a ? b : a; }

HG_NO_CONTRACT static double hg_gammaincc(double a, double x, double lg) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    if (x <= 0.0) return 1.0;
    double log_front = -x + a * log(x) - lg;
    if (x < a + 1.0) {
        double ap = a, term = 1.0 / a, total = term;
        for (int it = 0; it < 100000; it++) {
            ap += 1.0;
            term *= x / ap;
            total += term;
            if (fabs(term) < fabs(total) * 1e-15) break;
        }
        return hg_pymax(0.0, 1.0 - total * exp(log_front));
    }
    double b = x + 1.0 - a, c = 1e300, d = 1.0 / b, h = d;
    for (int64_t i = 1; i < 100000; i++) {
        double an = (double)(-i) * ((double)i - a);
        b += 2.0;
        d = an * d + b;
        d = fabs(d) > 1e-300 ? d : 1e-300;
        c = b + an / c;
        c = fabs(c) > 1e-300 ? c : 1e-300;
        d = 1.0 / d;
        double delta = d * c;
        h *= delta;
        if (fabs(delta - 1.0) < 1e-15) break;
    }
    return exp(log_front) * h;
}

HG_NO_CONTRACT static double hg_gamma_gap(double alpha, double u, double lg, double log_d) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    return log(hg_pymax(hg_gammaincc(alpha, exp(u), lg), 1e-300)) - log_d;
}

/* y with Q(alpha, y) = density; lg = lgamma(alpha), lg1 = lgamma(alpha + 1), z = the standard
 * normal's upper density-quantile, all from Python; newton_steps = fits._NEWTON_STEPS. */
HG_NO_CONTRACT double hg_gamma_upper_quantile(double alpha, double density, double lg, double lg1, double z,
                                              int newton_steps) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    density = hg_pymin(hg_pymax(density, 1e-300), 1.0 - 1e-12);
    double log_d = log(density);
    double u_small = (lg1 + log1p(-density)) / alpha;
    double big = -log_d;
    double u_large = log(hg_pymax(hg_pymax(big - lg + (alpha - 1.0) * log(hg_pymax(big, alpha)), 1e-3), alpha));
    double c = 1.0 / (9.0 * alpha);
    double u_wh = 3.0 * log(hg_pymax(1.0 - c + z * sqrt(c), 1e-3)) + log(alpha);
    double starts[3] = {u_small, u_large, u_wh};
    double u = starts[0], best = fabs(hg_gamma_gap(alpha, starts[0], lg, log_d));
    for (int j = 1; j < 3; j++) {
        double gap = fabs(hg_gamma_gap(alpha, starts[j], lg, log_d));
        if (gap < best) {
            best = gap;
            u = starts[j];
        }
    }
    for (int it = 0; it < newton_steps; it++) {
        double y = exp(u);
        double q = hg_pymax(hg_gammaincc(alpha, y, lg), 1e-300);
        double slope = -exp(hg_pymin((alpha - 1.0) * u - y - lg + u - log(q), 700.0));
        double step = hg_pymin(hg_pymax((log(q) - log_d) / hg_pymin(slope, -1e-300), -5.0), 5.0);
        u = u - step;
        if (fabs(step) <= 1e-14 * hg_pymax(1.0, fabs(u))) break;
    }
    return exp(u);
}

/* -- Random-k's stratified draw ------------------------------------------------------------- */

/* The i-th of k indices, uniform in the i-th stratum [floor(i n / k), floor((i + 1) n / k)):
 * start + ((h >> 1) * width >> 31), h a hash of (key, i).  The same integers as
 * selection/randomk.py's torch code (which runs on any device) and NumPy code; tests compare
 * them bit for bit.  The strata's starts advance by n / k plus a carry of n % k (no division
 * per entry); the hash is two rounds of a 32-bit mixer whose multipliers are below 2^31 (so
 * the torch code's int64 products are exact). */
static inline uint32_t hg_mix32(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x1B873593u;
    return x ^ (x >> 16);
}

HG_CLONES void hg_stratified_draw(int64_t n, int64_t k, uint64_t key, int32_t *out32, int64_t *out64) {
    int64_t size = n / k, extra = n % k, start = 0, carry = 0;
    uint32_t lo = (uint32_t)key, hi = (uint32_t)(key >> 32);
    for (int64_t i = 0; i < k; i++) {
        uint32_t h = hg_mix32(hg_mix32((uint32_t)i ^ lo) ^ hi ^ (uint32_t)((uint64_t)i >> 32));
        int64_t width = size;
        carry += extra;            /* floor((i + 1) extra / k) - floor(i extra / k) */
        if (carry >= k) { carry -= k; width += 1; }
        int64_t idx = start + (int64_t)(((uint64_t)(h >> 1) * (uint64_t)width) >> 31);
        if (out32) out32[i] = (int32_t)idx; else out64[i] = idx;
        start += width;
    }
}

/* -- SIDCo's host path: stages, fits, refinement rounds and selection in one call -------------- */

/* HostStages.select (selection/sidco_host.py) for the CPU host path, step for step and in
 * the same double arithmetic, so that both select the same entries (tests/unit/test_host_path.py runs
 * both on the same inputs and compares them).  In Python its few hundred scalar operations, the
 * ten-odd ctypes calls and the NumPy arrays between them cost 0.04-0.23 ms a call: as much as the
 * selection pass of a 1M-entry bucket, and the part of SIDCo's cost its definition does not ask for.
 * The accelerators' host fits keep the Python version (their passes and gathers run on the device).
 *
 * Python's min and max are hg_pymin/hg_pymax; Python's own functions come in as the same
 * computation: lgamma from the C library (CPython's math.lgamma differs from it in the last bits,
 * so only the gamma fit's stage 1 can differ, by an ulp of its threshold) and the normal quantile
 * as Wichura's AS241, which is what statistics.NormalDist.inv_cdf evaluates. */

enum { HG_EXPONENTIAL = 0, HG_GPARETO = 1, HG_GAMMA = 2 };

/* The settings, in the order NativeStages.settings (selection/sidco_native.py) writes them (HG_S_SIMD: native.sidco_select). */
enum {
    HG_S_DIST, HG_S_STAGES, HG_S_FIRST, HG_S_STAGE_DENSITY, HG_S_COMPACT, HG_S_REFINE, HG_S_TOLERANCE,
    HG_S_REFINE_HITS, HG_S_TRUST_HITS, HG_S_FIT_MIN, HG_S_DEEP_MIN, HG_S_GATHER_MIN, HG_S_CANDIDATE_FITS,
    HG_S_GATHER_AT_LEAST, HG_S_NEWTON_STEPS, HG_S_TINY, HG_S_SIMD, HG_S_COUNT
};

typedef struct { double m, s1, s2; } hg_moments;

/* One fitted stage: its base, the moments and density it was fitted with, its distribution, and
 * how many sampled entries its input held. */
typedef struct { double base; hg_moments mo; double density; int dist; double held; } hg_fit;

HG_NO_CONTRACT static double hg_normal_quantile(double p) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    /* Wichura (1988), AS241 PPND16: the inverse of the standard normal CDF. */
    double q = p - 0.5, r, num, den, x;
    if (fabs(q) <= 0.425) {
        r = 0.180625 - q * q;
        num = (((((((2.5090809287301226727e+3 * r + 3.3430575583588128105e+4) * r +
                    6.7265770927008700853e+4) * r + 4.5921953931549871457e+4) * r +
                  1.3731693765509461125e+4) * r + 1.9715909503065514427e+3) * r +
                1.3314166789178437745e+2) * r + 3.3871328727963666080e+0) * q;
        den = (((((((5.2264952788528545610e+3 * r + 2.8729085735721942674e+4) * r +
                    3.9307895800092710610e+4) * r + 2.1213794301586595867e+4) * r +
                  5.3941960214247511077e+3) * r + 6.8718700749205790830e+2) * r +
                4.2313330701600911252e+1) * r + 1.0);
        return num / den;
    }
    r = q <= 0.0 ? p : 1.0 - p;
    r = sqrt(-log(r));
    if (r <= 5.0) {
        r = r - 1.6;
        num = (((((((7.7454501427834140764e-4 * r + 2.2723844989269184583e-2) * r +
                    2.4178072517745061177e-1) * r + 1.2704582524523683826e+0) * r +
                  3.6478483247632046050e+0) * r + 5.7694972214606914055e+0) * r +
                4.6303378461565452959e+0) * r + 1.4234371107496835773e+0);
        den = (((((((1.05075007164441684324e-9 * r + 5.4759380849953449460e-4) * r +
                    1.5198666563616457197e-2) * r + 1.4810397642748007459e-1) * r +
                  6.8976733498510000455e-1) * r + 1.6763848301838038494e+0) * r +
                2.0531916266377588219e+0) * r + 1.0);
    } else {
        r = r - 5.0;
        num = (((((((2.01033439929228813265e-7 * r + 2.71155556874348757815e-5) * r +
                    1.2426609473880784386e-3) * r + 2.6532189526576123093e-2) * r +
                  2.9656057182850489123e-1) * r + 1.7848265399172913358e+0) * r +
                5.4637849111641143699e+0) * r + 6.6579046435011037772e+0);
        den = (((((((2.04426310338993978564e-15 * r + 1.4215117583164458887e-7) * r +
                    1.8463183175100546818e-5) * r + 7.8686913114561329059e-4) * r +
                  1.4875361290850614852e-2) * r + 1.3692988092273580531e-1) * r +
                5.9983220655588793769e-1) * r + 1.0);
    }
    x = num / den;
    return q < 0.0 ? -x : x;
}

static double hg_lgamma(double a) {
#if defined(__GLIBC__)
    int sign;
    return lgamma_r(a, &sign);   /* (lgamma writes the global signgam: not thread-safe) */
#else
    return lgamma(a);
#endif
}

/* fits.fitted_excess_host (newton_steps: fits._NEWTON_STEPS) */
HG_NO_CONTRACT static double hg_fitted_excess(int dist, hg_moments mo, double density, int newton_steps) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    double m = hg_pymax(mo.m, 1.0);
    double mean = mo.s1 / m;
    double var = hg_pymax(mo.s2 / m - mean * mean, 1e-12 * mean * mean + 1e-300);
    density = hg_pymin(hg_pymax(density, 1e-300), 1.0);
    double log_d = log(density);
    if (dist == HG_EXPONENTIAL) return -mean * log_d;
    double ratio = hg_pymin(hg_pymax(mean * mean / var, 1e-4), 1e4);
    if (dist == HG_GPARETO) {
        double xi = 0.5 * (1.0 - ratio);
        double sigma = 0.5 * mean * (1.0 + ratio);
        if (fabs(xi) < 1e-8) return -sigma * log_d;
        return sigma * expm1(-xi * log_d) / xi;
    }
    double alpha = hg_pymin(hg_pymax(ratio, 0.01), 1e4);
    double beta = var / hg_pymax(mean, 1e-300);
    if (density >= 1.0) return 0.0;
    /* fits.gamma_upper_quantile_host */
    double d = hg_pymin(hg_pymax(density, 1e-300), 1.0 - 1e-12);
    return beta * hg_gamma_upper_quantile(alpha, d, hg_lgamma(alpha), hg_lgamma(alpha + 1.0),
                                          -hg_normal_quantile(d), newton_steps);
}

/* The excess moments of v[0:c] over t (one native pass, as native.MomentsOf), weighed by w. */
static hg_moments hg_moments_over(const float *v, int64_t c, double t, int squares, double w) {
    double out[3];
    hg_exceedance_moments(v, c, (float)t, squares, out);
    hg_moments mo = {out[0] * w, out[1] * w, out[2] * w};
    return mo;
}

/* How many of v[0:c] have |v| >= t, weighed by w (native.MomentsOf.count_at_least). */
static double hg_count_at_least(const float *v, int64_t c, float t, double w) {
    double out[3];
    hg_exceedance_moments(v, c, nextafterf(t, -INFINITY), 0, out);
    return out[0] * w;
}

/* HostStages.refine_threshold over the counts of v[0:c] weighed by w. */
HG_NO_CONTRACT static double hg_sidco_refine(const double *set, const float *v, int64_t c, double w, double k,
                                             double threshold, const hg_fit *fit) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    double tol = set[HG_S_TOLERANCE];
    double few = k * (1.0 - tol), many = k * (1.0 + tol);
    double log_k = log(k);
    double log_d = log(hg_pymax(fit->density, 1e-300));
    double prev_log_d = 0.0, prev_log_kept = 0.0, too_few = 0.0, too_many = 0.0;
    int have_prev = 0, have_few = 0, have_many = 0;
    for (int round = 0; round < (int)set[HG_S_REFINE]; round++) {
        float at = (float)hg_pymax(threshold, set[HG_S_TINY]);
        double kept = hg_pymax(hg_count_at_least(v, c, at, w), 0.5);
        if (few <= kept && kept <= many) break;
        if (kept < few) {
            too_few = have_few ? hg_pymax(too_few, log_d) : log_d;
            have_few = 1;
        } else {
            too_many = have_many ? hg_pymin(too_many, log_d) : log_d;
            have_many = 1;
        }
        double log_kept = log(kept);
        if (have_few && have_many) {
            log_d = 0.5 * (too_few + too_many);
        } else {
            double slope = 1.0;
            if (have_prev && log_d != prev_log_d) {
                slope = (log_kept - prev_log_kept) / (log_d - prev_log_d);
                slope = hg_pymin(hg_pymax(slope, 0.3), 3.0);
            }
            double step = hg_pymin(hg_pymax((log_k - log_kept) / slope, -3.0), 3.0);
            prev_log_d = log_d;
            prev_log_kept = log_kept;
            have_prev = 1;
            log_d = hg_pymin(log_d + step, 0.0);
        }
        threshold = fit->base + hg_fitted_excess(fit->dist, fit->mo, exp(log_d), (int)set[HG_S_NEWTON_STEPS]);
    }
    return threshold;
}

/* The entries of x with |x| >= t (native.select's gather, its buffers grown to fit): returns the
 * count, or -1 when out of memory. */
static int64_t hg_gather(const float *x, int64_t n, float t, double expected, int simd,
                         int32_t **idx, float **val, int64_t *room) {
    int64_t cap = (int64_t)(expected * 1.5) + 64;
    cap = cap < n ? cap : n;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (cap + 16 > *room) {
            free(*idx);
            free(*val);
            *room = cap + 16;
            *idx = malloc((size_t)*room * sizeof(int32_t));
            *val = malloc((size_t)*room * sizeof(float));
            if (!*idx || !*val) return -1;
        }
        int64_t c = hg_select(x, n, t, 0, expected / (double)(n > 1 ? n : 1), *idx, *val, cap, simd);
        if (c <= cap) return c;
        cap = c;   /* the pass counted them: once more with room for all */
        expected = (double)c;
    }
    return -1;
}

/* The latest fit whose input held at least `hits` sampled entries (else stage 1's): a refinement
 * on the sample's counts goes there (see HostStages.select's refit). */
static const hg_fit *hg_latest_fit(const hg_fit *fits, int64_t nfits, double hits) {
    for (int64_t j = nfits - 1; j >= 0; j--)
        if (fits[j].held >= hits) return &fits[j];
    return &fits[0];
}

/* Returns the size of the selection and writes as much of it as fits in out_idx/out_val (cap
 * entries: the caller selects again from x at info[0] when it is larger), or -1 when out of memory.
 * info: [0] the final threshold (a float), [1] the stages fitted, [2] the streaming passes over x
 * that fitted a stage, [3] the candidates gathered (0 without a candidate phase), [4] how many times
 * they were gathered (a select pass over x each: 0, 1, or 2 after an overshoot). */
HG_NO_CONTRACT int64_t hg_sidco_select(const float *x, int64_t n, const float *sample, int64_t s, int64_t k,
                                       const double *set, int32_t *out_idx, float *out_val, int64_t cap,
                                       double *info) {
#if defined(__clang__)
#pragma clang fp contract(off)
#endif
    int dist1 = (int)set[HG_S_DIST];
    int64_t fixed = (int64_t)set[HG_S_STAGES];
    int adaptive = fixed == 0, refine = (int)set[HG_S_REFINE] > 0, simd = (int)set[HG_S_SIMD];
    int squares = dist1 != HG_EXPONENTIAL;
    int later = dist1 == HG_GAMMA ? HG_GPARETO : dist1;   /* SIDCoSelector._stage_dist after stage 1 */
    int newton = (int)set[HG_S_NEWTON_STEPS];
    double tiny = set[HG_S_TINY], tol = set[HG_S_TOLERANCE], sd = set[HG_S_STAGE_DENSITY];
    double dk = (double)k, dn = (double)n;
    int64_t result = -1, stage = 1, passes = 0, gathers = 0, mcount = 0, room = 0, plan_len = 0, nfits = 0;
    int32_t *cidx = NULL;
    float *cval = NULL, *strided = NULL;
    double *plan = NULL;
    hg_fit *fits = NULL;
    double final_t = 0.0;

    /* the stage plan (SIDCoSelector._plan), at most 64 + log(n) / log(1 / stage_density) long */
    int64_t most = adaptive ? 64 + (int64_t)(log(dn + 1.0) / -log(sd > 0.0 && sd < 1.0 ? sd : 0.5)) + 2 : fixed;
    plan = malloc((size_t)(most + 1) * sizeof(double));
    fits = malloc((size_t)(most + 2) * sizeof(hg_fit));
    if (!plan || !fits) goto done;
    if (!adaptive) {
        for (int64_t j = 1; j <= fixed; j++) plan[plan_len++] = dn * pow(dk / dn, (double)j / (double)fixed);
    } else if (set[HG_S_FIRST] * dn <= dk) {
        plan[plan_len++] = sqrt((double)(n * k));
        plan[plan_len++] = dk;
    } else {
        double target = set[HG_S_FIRST] * dn;
        while (target > dk * (1.0 + 1e-9) && plan_len < most) {
            plan[plan_len++] = target;
            target *= sd;
        }
        plan[plan_len++] = dk;
    }
    /* the sample's minimum (NaN when it holds one, as NumPy's), and the stages that would keep every
     * nonzero left out */
    double base = sample[0];
    for (int64_t i = 1; i < s; i++) {
        if (isnan(base)) break;
        double v = sample[i];
        base = isnan(v) || v < base ? v : base;
    }
    double nonzeros = dn;
    if (base == 0.0) {
        int64_t nonzero = 0;
        for (int64_t i = 0; i < s; i++) nonzero += sample[i] != 0.0f;
        nonzeros = (double)(n * nonzero) / (double)s;
        int64_t kept = 0;
        for (int64_t j = 0; j < plan_len; j++)
            if (plan[j] < nonzeros) plan[kept++] = plan[j];
        if (kept == 0) plan[kept++] = dk;
        plan_len = kept;
    }
    double scale = dn / (double)s;
    double hits_k = (double)(k * s) / dn;   /* k's share of the sample */
    /* the candidates of a last stage fitted on them planned at GATHER_AT_LEAST k at least */
    double raised = set[HG_S_GATHER_AT_LEAST] * dk;
    if (adaptive && refine && s < n && hits_k < set[HG_S_REFINE_HITS] && plan_len >= 3
        && plan[plan_len - 2] < raised && raised < plan[plan_len - 3] && raised < nonzeros)
        plan[plan_len - 2] = raised;
    hg_moments mo = hg_moments_over(sample, s, base, squares, 1.0);
    double density = hg_pymin(plan[0] / hg_pymax(mo.m * scale, 1.0), 1.0);
    fits[nfits++] = (hg_fit){base, mo, density, dist1, mo.m};
    double threshold = base + hg_fitted_excess(dist1, mo, density, newton);
#define HG_REFIT(HITS, T) hg_sidco_refine(set, sample, s, 1.0, (HITS), (T), hg_latest_fit(fits, nfits, (HITS)))
    if (adaptive && refine) threshold = HG_REFIT(plan[0] / scale, threshold);
    while (stage < plan_len) {
        if (adaptive && refine && stage == plan_len - 1 && s < n && hits_k < set[HG_S_REFINE_HITS]) break;
        mo = hg_moments_over(sample, s, threshold, squares, 1.0);
        double held = s < n ? mo.m : 0.0;
        int on_sample;
        if (adaptive && stage < plan_len - 1 && held >= set[HG_S_DEEP_MIN]) {
            on_sample = 1;
        } else if (plan[stage - 1] > set[HG_S_COMPACT] * dn) {
            if (s < n && held < set[HG_S_FIT_MIN] && dn >= set[HG_S_GATHER_MIN]) break;
            on_sample = held >= set[HG_S_FIT_MIN];
        } else {
            break;
        }
        if (on_sample) {
            mo.m *= scale;
            mo.s1 *= scale;
            mo.s2 *= scale;
        } else {
            mo = hg_moments_over(x, n, threshold, squares, 1.0);
            passes++;
        }
        double target = plan[stage];
        stage++;
        density = hg_pymin(target / hg_pymax(mo.m, 1.0), 1.0);
        fits[nfits++] = (hg_fit){threshold, mo, density, later, mo.m / scale};
        threshold = threshold + hg_fitted_excess(later, mo, density, newton);
    }
    int checked = 0;
    if (stage == plan_len) {
        if (adaptive && refine && hits_k >= set[HG_S_REFINE_HITS]) {
            threshold = HG_REFIT(hits_k, threshold);
            checked = s < n && hits_k < set[HG_S_TRUST_HITS];
        }
        if (!checked) {   /* the selection itself, from x */
            final_t = (float)hg_pymax(threshold, tiny);
            result = hg_select(x, n, (float)final_t, 0, dk / dn, out_idx, out_val, cap < n ? cap : n, simd);
            goto done;
        }
    }
    /* the candidate phase */
    double gather_t = (float)hg_pymax(threshold, tiny);
    mcount = hg_gather(x, n, (float)gather_t, plan[stage - 1], simd, &cidx, &cval, &room);
    gathers++;
    if (mcount < 0) goto done;
    double slack = checked ? 2.0 * tol : tol;
    int all = checked && dk * (1.0 - slack) <= (double)mcount && (double)mcount <= dk * (1.0 + slack);
    if (!all && (double)mcount < dk * (1.0 - slack) && adaptive && refine && s < n) {
        /* the last stage fitted on the sample overshot: ask the fits for 2k and gather again */
        threshold = HG_REFIT(2.0 * dk * (double)s / dn, threshold);
        gather_t = (float)hg_pymax(threshold, tiny);
        mcount = hg_gather(x, n, (float)gather_t, (double)(2 * k), simd, &cidx, &cval, &room);
        gathers++;
        if (mcount < 0) goto done;
    }
#undef HG_REFIT
    if (all || mcount <= k) {   /* the candidates are the selection */
        final_t = gather_t;
        result = mcount;
        if (mcount <= cap) {
            memcpy(out_idx, cidx, (size_t)mcount * sizeof(int32_t));
            memcpy(out_val, cval, (size_t)mcount * sizeof(float));
        }
        goto done;
    }
    /* fits and counts on every stride-th candidate (all of them up to CANDIDATE_FITS), weighed up */
    int64_t limit = (int64_t)set[HG_S_CANDIDATE_FITS];
    int64_t stride = (mcount + limit - 1) / limit;
    stride = stride > 1 ? stride : 1;
    const float *values = cval;
    int64_t nvalues = mcount;
    if (stride > 1) {
        nvalues = (mcount + stride - 1) / stride;
        strided = malloc((size_t)nvalues * sizeof(float));
        if (!strided) goto done;
        for (int64_t j = 0; j < nvalues; j++) strided[j] = cval[j * stride];
        values = strided;
    }
    double w = (double)stride;
    int64_t rest = 0;
    if (adaptive) {
        rest = (int64_t)ceil(log(dk / (double)mcount) / log(sd));
        rest = rest > 1 ? rest : 1;
    }
    int64_t count = adaptive ? rest : plan_len - stage;
    hg_fit last = fits[0];
    for (int64_t j = 1; j <= count; j++) {
        double target = adaptive ? (double)mcount * pow(dk / (double)mcount, (double)j / (double)rest)
                                 : plan[stage];
        stage++;
        mo = hg_moments_over(values, nvalues, threshold, squares, w);
        density = hg_pymin(target / hg_pymax(mo.m, 1.0), 1.0);
        last = (hg_fit){threshold, mo, density, later, 0.0};
        threshold = threshold + hg_fitted_excess(later, mo, density, newton);
    }
    if (adaptive && refine) threshold = hg_sidco_refine(set, values, nvalues, w, dk, threshold, &last);
    final_t = (float)hg_pymax(threshold, tiny);
    result = hg_select(cval, mcount, (float)final_t, 0, dk / (double)mcount, out_idx, out_val,
                       cap < mcount ? cap : mcount, simd);
    if (result <= cap)
        for (int64_t j = 0; j < result; j++) out_idx[j] = cidx[out_idx[j]];
done:
    info[0] = final_t;
    info[1] = (double)stage;
    info[2] = (double)passes;
    info[3] = (double)mcount;
    info[4] = (double)gathers;
    free(plan);
    free(fits);
    free(cidx);
    free(cval);
    free(strided);
    return result;
}
