/*
 * _sha1batch: first bytes of SHA-1 for many byte strings in one call, for minhash.py.
 *
 * Why a hand-written SHA-1 exists here (measured on the project's shared 2-core AMD EPYC box,
 * 200k word 5-shingles of ~33 bytes, i.e. one SHA-1 block each, best of several runs):
 *   hashlib loop, hashlib.sha1(s).digest()[:4]    ~380 ns/shingle (~490 with struct.unpack, as
 *                                                  datasketch does): per-call Python overhead
 *   DuckDB sha1() on Arrow string views + hex decode ~170-260 ns/shingle (previous minhash path)
 *   this file, portable C compress                  ~170 ns/shingle
 *   this file, SHA-NI (2 messages interleaved)      ~28-35 ns/shingle (46 without interleaving)
 * datasketch's sha1_hash32 fixes the hash: bit identity with it forbids a cheaper one, so
 * batching SHA-1 in compiled code is the only lever left; with SHA-NI it drops from the largest
 * phase of a signature chunk (~35 of ~75 CPU ms per 1024 docs) to ~7 ms. Both compress
 * functions are checked against hashlib for every length 0..300 and longer multi-block messages
 * in tests/governance/test_minhash.py.
 *
 * One function:
 *   sha1_le(buf, starts, ends, out, portable=False) -> None
 *     buf:    any C-contiguous bytes-like object
 *     starts, ends: C-contiguous int64 buffers of equal length n; message i = buf[starts[i]:ends[i]]
 *             (separate starts/ends rather than n+1 offsets because word shingles overlap; the
 *             offsets form is starts=off[:-1], ends=off[1:])
 *     out:    writable C-contiguous buffer of n 4-byte or 8-byte integers; out[i] = the first 4
 *             (or 8) digest bytes read little-endian (= struct.unpack('<I' / '<Q', sha1[:4/8]))
 *     portable: force the portable compress function even when SHA-NI is available (tests)
 *   The GIL is released while hashing. Module attribute IMPL is "sha-ni" or "portable".
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef void (*compress_fn)(uint32_t st[5], const uint8_t *blocks, size_t nblocks);

static inline uint32_t rol32(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

static inline uint32_t load_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

/* FIPS 180-4 SHA-1 compression, 16-word circular message schedule. */
static void sha1_compress_portable(uint32_t st[5], const uint8_t *p, size_t nblocks) {
    for (; nblocks; nblocks--, p += 64) {
        uint32_t w[16], a = st[0], b = st[1], c = st[2], d = st[3], e = st[4], t;
        int i;
        for (i = 0; i < 16; i++) w[i] = load_be32(p + 4 * i);
        for (i = 0; i < 80; i++) {
            if (i >= 16) {
                t = w[(i + 13) & 15] ^ w[(i + 8) & 15] ^ w[(i + 2) & 15] ^ w[i & 15];
                w[i & 15] = rol32(t, 1);
            }
            if (i < 20)
                t = ((b & c) | (~b & d)) + 0x5A827999u;
            else if (i < 40)
                t = (b ^ c ^ d) + 0x6ED9EBA1u;
            else if (i < 60)
                t = ((b & c) | (b & d) | (c & d)) + 0x8F1BBCDCu;
            else
                t = (b ^ c ^ d) + 0xCA62C1D6u;
            t += rol32(a, 5) + e + w[i & 15];
            e = d; d = c; c = rol32(b, 30); b = a; a = t;
        }
        st[0] += a; st[1] += b; st[2] += c; st[3] += d; st[4] += e;
    }
}

/* RATCHET_SHA1_NO_SHANI builds the portable path only (what non-x86 / non-GCC builds get). */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(RATCHET_SHA1_NO_SHANI)
#define HAVE_SHANI_CODE 1
#include <cpuid.h>
#include <immintrin.h>

/* SHA-NI compression (Intel SHA extensions; also on AMD Zen). Compiled with a per-function
 * target attribute so the file builds without -msha; only called after the CPUID check. */
/* One group of 4 rounds for lane j: message schedule W_g = msg2(msg1(W_g-4, W_g-3) ^ W_g-2, W_g-1),
 * e for the group from a of the group before (sha1nexte), then sha1rnds4 with function f. */
#define SHANI_GROUP(j, g, f)                                                                   \
    do {                                                                                       \
        if ((g) >= 4)                                                                          \
            W[j][(g) & 3] = _mm_sha1msg2_epu32(                                                \
                _mm_xor_si128(_mm_sha1msg1_epu32(W[j][(g) & 3], W[j][((g) + 1) & 3]),          \
                              W[j][((g) + 2) & 3]),                                            \
                W[j][((g) + 3) & 3]);                                                          \
        ein[j] = (g) == 0 ? _mm_add_epi32(E0[j], W[j][0]) : _mm_sha1nexte_epu32(prev[j], W[j][(g) & 3]); \
        prev[j] = abcd[j];                                                                     \
        abcd[j] = _mm_sha1rnds4_epu32(abcd[j], ein[j], f);                                     \
    } while (0)

/* L independent single-block compressions, interleaved so the sha1rnds4 latency chains of the
 * lanes overlap (L=2 for two one-block shingles at once, L=1 otherwise). */
#define SHANI_BODY(L)                                                                          \
    do {                                                                                       \
        const __m128i mask = _mm_set_epi64x(0x0001020304050607LL, 0x08090a0b0c0d0e0fLL);       \
        __m128i W[L][4], ein[L], prev[L], E0[L], abcd[L], save[L];                             \
        int j, k;                                                                              \
        for (j = 0; j < (L); j++) {                                                            \
            abcd[j] = save[j] = prev[j] = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)st[j]), 0x1B); \
            E0[j] = _mm_set_epi32((int)st[j][4], 0, 0, 0);                                     \
            for (k = 0; k < 4; k++)                                                            \
                W[j][k] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p[j] + 16 * k)), mask); \
        }                                                                                      \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 0, 0);                                        \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 1, 0);                                        \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 2, 0);                                        \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 3, 0);                                        \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 4, 0);                                        \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 5, 1);                                        \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 6, 1);                                        \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 7, 1);                                        \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 8, 1);                                        \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 9, 1);                                        \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 10, 2);                                       \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 11, 2);                                       \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 12, 2);                                       \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 13, 2);                                       \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 14, 2);                                       \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 15, 3);                                       \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 16, 3);                                       \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 17, 3);                                       \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 18, 3);                                       \
        for (j = 0; j < (L); j++) SHANI_GROUP(j, 19, 3);                                       \
        for (j = 0; j < (L); j++) {                                                            \
            /* e after 80 rounds = rol30(a of 4 rounds back) + saved e */                      \
            E0[j] = _mm_sha1nexte_epu32(prev[j], E0[j]);                                       \
            _mm_storeu_si128((__m128i *)st[j], _mm_shuffle_epi32(_mm_add_epi32(abcd[j], save[j]), 0x1B)); \
            st[j][4] = (uint32_t)_mm_extract_epi32(E0[j], 3);                                  \
        }                                                                                      \
    } while (0)

__attribute__((target("sha,sse4.1,ssse3")))
static void sha1_block_shani_x2(uint32_t *st[2], const uint8_t *p[2]) { SHANI_BODY(2); }

__attribute__((target("sha,sse4.1,ssse3")))
static void sha1_compress_shani(uint32_t st0[5], const uint8_t *p0, size_t nblocks) {
    uint32_t *st[1] = {st0};
    const uint8_t *p[1];
    for (; nblocks; nblocks--, p0 += 64) {
        p[0] = p0;
        SHANI_BODY(1);
    }
}

static int cpu_has_shani(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if (!(c & (1u << 9)) || !(c & (1u << 19))) return 0;  /* SSSE3, SSE4.1 */
    if (__get_cpuid_max(0, 0) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 29) & 1;                                  /* SHA */
}
#endif

static compress_fn best_compress = sha1_compress_portable;
static int use_x2 = 0; /* SHA-NI present: hash pairs of one-block messages interleaved */

static const uint32_t SHA1_IV[5] = {0x67452301u, 0xEFCDAB89u, 0x98BADCFEu, 0x10325476u, 0xC3D2E1F0u};

/* Final padded block(s) of a len-byte message whose full blocks are already compressed;
 * returns the number of tail blocks (1 or 2). */
static inline size_t sha1_tail(uint8_t tail[128], const uint8_t *msg, size_t len) {
    size_t r = len % 64, tl = r < 56 ? 64 : 128;
    uint64_t bits = (uint64_t)len * 8;
    int i;
    memcpy(tail, msg + (len - r), r);
    tail[r] = 0x80;
    memset(tail + r + 1, 0, tl - r - 1 - 8);
    for (i = 0; i < 8; i++) tail[tl - 1 - i] = (uint8_t)(bits >> (8 * i));
    return tl / 64;
}

/* SHA-1 state after hashing msg[0:len] (digest = the 5 words big-endian). */
static inline void sha1_state(compress_fn compress, const uint8_t *msg, size_t len, uint32_t st[5]) {
    uint8_t tail[128];
    size_t nt;
    memcpy(st, SHA1_IV, sizeof SHA1_IV);
    if (len >= 64) compress(st, msg, len / 64);
    nt = sha1_tail(tail, msg, len);
    compress(st, tail, nt);
}

static inline uint32_t bswap32(uint32_t x) {
    return (x >> 24) | ((x >> 8) & 0xFF00u) | ((x << 8) & 0xFF0000u) | (x << 24);
}

static inline void store_le(void *out, Py_ssize_t itemsize, Py_ssize_t i, const uint32_t st[5]) {
    if (itemsize == 4)
        ((uint32_t *)out)[i] = bswap32(st[0]);
    else
        ((uint64_t *)out)[i] = (uint64_t)bswap32(st[0]) | ((uint64_t)bswap32(st[1]) << 32);
}

static int is_int_format(const char *fmt, Py_ssize_t itemsize, Py_ssize_t want) {
    char ch;
    if (fmt == NULL || itemsize != want) return 0;
    if (*fmt == '<' || *fmt == '=' || *fmt == '@') fmt++;
    ch = fmt[0];
    return fmt[1] == '\0' && strchr("bBhHiIlLqQ", ch) != NULL;
}

static PyObject *sha1_le(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"buf", "starts", "ends", "out", "portable", NULL};
    PyObject *obuf, *ost, *oen, *oout;
    int portable = 0;
    Py_buffer buf = {0}, st = {0}, en = {0}, out = {0};
    Py_ssize_t n, bad = -1, i;
    compress_fn compress;
    int x2;
    PyObject *ret = NULL;

    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|p", kwlist, &obuf, &ost, &oen, &oout, &portable))
        return NULL;
    if (PyObject_GetBuffer(obuf, &buf, PyBUF_C_CONTIGUOUS) < 0) goto done;
    if (PyObject_GetBuffer(ost, &st, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
    if (PyObject_GetBuffer(oen, &en, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) goto done;
    if (PyObject_GetBuffer(oout, &out, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) < 0) goto done;
    if (!is_int_format(st.format, st.itemsize, 8) || !is_int_format(en.format, en.itemsize, 8)) {
        PyErr_SetString(PyExc_TypeError, "starts and ends must be int64 buffers");
        goto done;
    }
    if (!is_int_format(out.format, out.itemsize, 4) && !is_int_format(out.format, out.itemsize, 8)) {
        PyErr_SetString(PyExc_TypeError, "out must be a buffer of 4- or 8-byte integers");
        goto done;
    }
    n = st.len / 8;
    if (en.len / 8 != n || out.len / out.itemsize != n) {
        PyErr_Format(PyExc_ValueError, "length mismatch: %zd starts, %zd ends, %zd outputs",
                     n, en.len / 8, out.len / out.itemsize);
        goto done;
    }
    compress = portable ? sha1_compress_portable : best_compress;
    x2 = use_x2 && !portable;
    (void)x2; /* unused without SHA-NI code */
    {
        const uint8_t *data = (const uint8_t *)buf.buf;
        const int64_t *s = (const int64_t *)st.buf, *e = (const int64_t *)en.buf;
        int64_t blen = (int64_t)buf.len;
        uint32_t h[5];
        Py_BEGIN_ALLOW_THREADS
        for (i = 0; i < n; i++) {
            if (s[i] < 0 || e[i] < s[i] || e[i] > blen) { bad = i; break; }
#ifdef HAVE_SHANI_CODE
            /* two messages of < 56 bytes (one padded block each; most word shingles) at once */
            if (x2 && e[i] - s[i] < 56 && i + 1 < n && e[i + 1] - s[i + 1] < 56 && s[i + 1] >= 0 &&
                e[i + 1] >= s[i + 1] && e[i + 1] <= blen) {
                uint8_t t0[128], t1[128];
                uint32_t h1[5];
                uint32_t *sts[2] = {h, h1};
                const uint8_t *ps[2] = {t0, t1};
                sha1_tail(t0, data + s[i], (size_t)(e[i] - s[i]));
                sha1_tail(t1, data + s[i + 1], (size_t)(e[i + 1] - s[i + 1]));
                memcpy(h, SHA1_IV, sizeof SHA1_IV);
                memcpy(h1, SHA1_IV, sizeof SHA1_IV);
                sha1_block_shani_x2(sts, ps);
                store_le(out.buf, out.itemsize, i, h);
                store_le(out.buf, out.itemsize, i + 1, h1);
                i++;
                continue;
            }
#endif
            sha1_state(compress, data + s[i], (size_t)(e[i] - s[i]), h);
            store_le(out.buf, out.itemsize, i, h);
        }
        Py_END_ALLOW_THREADS
        if (bad >= 0) {
            PyErr_Format(PyExc_ValueError, "span %zd = [%lld, %lld) is outside the %zd-byte buffer",
                         bad, (long long)s[bad], (long long)e[bad], buf.len);
            goto done;
        }
    }
    ret = Py_NewRef(Py_None);
done:
    if (buf.obj) PyBuffer_Release(&buf);
    if (st.obj) PyBuffer_Release(&st);
    if (en.obj) PyBuffer_Release(&en);
    if (out.obj) PyBuffer_Release(&out);
    return ret;
}

static PyMethodDef methods[] = {
    {"sha1_le", (PyCFunction)(void (*)(void))sha1_le, METH_VARARGS | METH_KEYWORDS,
     "sha1_le(buf, starts, ends, out, portable=False): out[i] = first 4/8 bytes (little-endian) "
     "of sha1(buf[starts[i]:ends[i]]); releases the GIL."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_sha1batch",
                                       "Batched SHA-1 prefixes for MinHash (see _sha1batch.c).", -1, methods,
                                       NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__sha1batch(void) {
    PyObject *m = PyModule_Create(&moduledef);
    const char *impl = "portable";
    if (m == NULL) return NULL;
#ifdef HAVE_SHANI_CODE
    if (cpu_has_shani()) {
        best_compress = sha1_compress_shani;
        use_x2 = 1;
        impl = "sha-ni";
    }
#endif
    if (PyModule_AddStringConstant(m, "IMPL", impl) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
