/*
 * extender._packed: the per-name work of filter and prioritize, compiled.
 *
 * kube-scheduler sends up to thousands of node names per call as a JSON array and expects them
 * back, grouped or scored. In CPython every name costs a fresh string, a hash and a dict probe
 * on the way in, and an object gather and a join on the way out: at 5,000 names that is most
 * of a filter call. Here the names are never turned into Python objects: they are read in
 * place from the request body, looked up in a table built once per inventory layout, and
 * written back from the same bytes.
 *
 * Only the "plain" form is handled: "a","b","c" with every name printable ASCII and free of
 * '"' and '\\' (every valid Kubernetes node name, exactly as Go's encoder writes it). Anything
 * else makes scan() answer -1 and the caller decodes the body in full instead. The pure-Python
 * module extender/_packed_py.py has the same functions and answers; the tests hold the two to
 * the same results.
 *
 * Memory safety does not depend on scan() having been called: scan() never reads outside
 * [start, end); every other function checks each (offset, length) pair against the buffer,
 * never reads outside the buffer, and fails cleanly on anything unexpected.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ parsing */

/* A span is described, once scan() has read it, by one (offset, length) pair of int32 per
 * name: where the name's bytes start in the buffer, without the quotes. Every later call
 * takes the buffer and those pairs, and checks each pair against the buffer's bounds. */
typedef struct {
    int32_t offset;
    int32_t length;
} Name;

#define ONES 0x0101010101010101ULL
#define HIGHS 0x8080808080808080ULL

/* High bit set in every byte of x that is zero (exact for the lowest such byte). */
static inline uint64_t zero_bytes(uint64_t x) { return (x - ONES) & ~x & HIGHS; }

/* High bit set in bytes that end a name or make it not plain: '"', '\\', control bytes,
 * DEL and non-ASCII. The lowest one is exact, which is all the scan uses. */
static inline uint64_t stop_bytes(uint64_t x) {
    return zero_bytes(x ^ (ONES * '"')) | zero_bytes(x ^ (ONES * '\\')) |
           zero_bytes(x ^ (ONES * 0x7f)) | ((x - ONES * 0x20) & ~x & HIGHS) | (x & HIGHS);
}

static inline uint64_t load64(const char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* The first byte at or after p, before end, that is not plain; end if none. Eight bytes at a
 * time: at thousands of names per call, this loop is the cost of reading them. */
static inline const char *find_stop(const char *p, const char *end) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (end - p >= 8) {
        uint64_t stops = stop_bytes(load64(p));
        if (stops) return p + (__builtin_ctzll(stops) >> 3);
        p += 8;
    }
#endif
    while (p < end) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\' || c < 0x20 || c >= 0x7f) return p;
        p++;
    }
    return end;
}

static int get_buffer(PyObject *obj, Py_buffer *view) {
    return PyObject_GetBuffer(obj, view, PyBUF_SIMPLE);
}

#if defined(__SSE2__)
#include <emmintrin.h>

/* For the 16 bytes at p: bit i of *quotes set where byte i is '"', of *bad where it makes a
 * span not plain ('\\', DEL, control bytes, non-ASCII). */
static inline void classify16(const char *p, uint32_t *quotes, uint32_t *bad) {
    __m128i v = _mm_loadu_si128((const __m128i *)p);
    __m128i q = _mm_cmpeq_epi8(v, _mm_set1_epi8('"'));
    /* Signed: every byte >= 0x80 is negative, so below 0x20 with the control bytes. */
    __m128i b = _mm_or_si128(_mm_cmplt_epi8(v, _mm_set1_epi8(0x20)),
                             _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('\\')),
                                          _mm_cmpeq_epi8(v, _mm_set1_epi8(0x7f))));
    *quotes = (uint32_t)_mm_movemask_epi8(q);
    *bad = (uint32_t)_mm_movemask_epi8(b);
}

/* The names of base[start:end] into names (room for most), or -1 if the span is not plain.
 * Sixty-four bytes at a time: a mask of the quotes and one of the bytes no plain span has;
 * then one step per quote. A plain span is quotes in pairs, the first at start, the last at
 * end - 1, and exactly one ',' between a name's closing quote and the next one's opening. */
static Py_ssize_t scan_names(const char *base, Py_ssize_t start, Py_ssize_t end, Name *names,
                             Py_ssize_t most) {
    Py_ssize_t n = 0, opened = -1, closed = -1;
    for (Py_ssize_t block = start; block < end; block += 64) {
        const char *p = base + block;
        char tail[64];
        Py_ssize_t left = end - block;
        if (left < 64) { /* the last block: what follows the span is not read */
            memset(tail, '"', sizeof tail);
            memcpy(tail, p, (size_t)left);
            p = tail;
        }
        uint64_t quotes = 0, bad = 0;
        for (int part = 0; part < 4; part++) {
            uint32_t q, b;
            classify16(p + 16 * part, &q, &b);
            quotes |= (uint64_t)q << (16 * part);
            bad |= (uint64_t)b << (16 * part);
        }
        if (left < 64) {
            uint64_t inside = (UINT64_C(1) << left) - 1;
            quotes &= inside;
            bad &= inside;
        }
        if (bad) return -1;
        while (quotes) {
            Py_ssize_t at = block + __builtin_ctzll(quotes);
            quotes &= quotes - 1;
            if (opened < 0) { /* an opening quote: first, or right after ',' */
                if (n == 0 ? at != start : (at != closed + 2 || base[closed + 1] != ',')) return -1;
                opened = at;
            } else {
                if (n == most) return -1;
                names[n++] = (Name){(int32_t)(opened + 1), (int32_t)(at - opened - 1)};
                closed = at;
                opened = -1;
            }
        }
    }
    if (opened >= 0 || (n ? closed != end - 1 : start != end)) return -1;
    return n;
}
#else
/* Without SSE2: one name at a time, eight bytes at a time (find_stop). */
static Py_ssize_t scan_names(const char *base, Py_ssize_t start, Py_ssize_t end, Name *names,
                             Py_ssize_t most) {
    const char *p = base + start, *stop = base + end;
    Py_ssize_t n = 0;
    while (p < stop) {
        if (n && *p++ != ',') return -1;
        if (p >= stop || *p != '"') return -1;
        const char *s = ++p;
        p = find_stop(s, stop);
        if (p == stop || *p != '"' || n == most) return -1;
        names[n++] = (Name){(int32_t)(s - base), (int32_t)(p - s)};
        p++;
    }
    return n;
}
#endif

/* scan(buf, start, end) -> bytearray | None: the names of buf[start:end] as (offset, length)
 * int32 pairs if the span is in plain form ("a","b",... or nothing), else None. */
static PyObject *scan(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *buf;
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "Onn:scan", &buf, &start, &end)) return NULL;
    Py_buffer view;
    if (get_buffer(buf, &view) < 0) return NULL;
    if (start < 0 || end < start || end > view.len || view.len > INT32_MAX) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "span outside the buffer");
        return NULL;
    }
    const char *base = (const char *)view.buf;
    /* At most one name per 3 bytes ("",), plus one. */
    Py_ssize_t most = (end - start) / 3 + 1;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, most * (Py_ssize_t)sizeof(Name));
    if (out == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    Py_ssize_t n = scan_names(base, start, end, (Name *)PyByteArray_AS_STRING(out), most);
    PyBuffer_Release(&view);
    if (n < 0) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    if (PyByteArray_Resize(out, n * (Py_ssize_t)sizeof(Name)) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* The buffer and the name pairs of a call, checked: every pair inside the buffer. */
typedef struct {
    Py_buffer buf;
    Py_buffer names;
    const char *base;
    const Name *name;
    Py_ssize_t count;
} Names;

static void release_names(Names *names) {
    PyBuffer_Release(&names->buf);
    PyBuffer_Release(&names->names);
}

static int get_names(PyObject *buf, PyObject *pairs, Names *names) {
    if (get_buffer(buf, &names->buf) < 0) return -1;
    if (get_buffer(pairs, &names->names) < 0) {
        PyBuffer_Release(&names->buf);
        return -1;
    }
    names->base = (const char *)names->buf.buf;
    names->name = (const Name *)names->names.buf;
    names->count = names->names.len / (Py_ssize_t)sizeof(Name);
    int ok = names->names.len % (Py_ssize_t)sizeof(Name) == 0;
    for (Py_ssize_t i = 0; ok && i < names->count; i++) {
        const Name *m = &names->name[i];
        ok = m->offset >= 0 && m->length >= 0 &&
             (Py_ssize_t)m->offset + (Py_ssize_t)m->length <= names->buf.len;
    }
    if (!ok) {
        release_names(names);
        PyErr_SetString(PyExc_ValueError, "name pairs outside the buffer");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------ the name table */

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

/* The len (< 8) bytes at p as a little-endian integer, zero above them; lo is where the
 * memory p lies in starts. A name's last bytes are most often not a whole word: when the eight
 * bytes that end with them are readable (there is a request body or the arena's padding
 * before them), one unaligned load and a shift instead of a loop a byte at a time. */
static inline uint64_t load_short(const char *p, Py_ssize_t len, const char *lo) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (len > 0 && (p - lo) + len >= 8) return load64(p + len - 8) >> (8 * (8 - len));
#endif
    uint64_t v = 0;
    for (Py_ssize_t i = 0; i < len; i++) /* not memcpy: a call per name, for < 8 bytes */
        v |= (uint64_t)(unsigned char)p[i] << (8 * i);
    return v;
}

/* A fast hash of a short byte string, eight bytes at a time. The table's keys are the
 * inventory's own node names, so a request cannot lengthen its probe chains. */
static uint64_t hash_bytes(const char *p, Py_ssize_t len, const char *lo) {
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)len;
    while (len >= 8) {
        h = (h ^ load64(p)) * 0x100000001b3ULL;
        h = (h << 29) | (h >> 35);
        p += 8;
        len -= 8;
    }
    h = (h ^ load_short(p, len, lo)) * 0x100000001b3ULL;
    return mix(h);
}

/* Open addressing, kept small so that it stays in cache: a bucket is the upper half of the
 * name's hash and its slot; the name's bytes, for the final comparison, are in the arena. */
typedef struct {
    uint32_t tag;
    int32_t slot; /* 0: empty */
} Bucket;

/* Before the first name in the arena: what load_short reads before a short name. */
#define ARENA_PAD 8

typedef struct {
    PyObject_HEAD
    Bucket *buckets;
    Py_ssize_t mask; /* capacity - 1 */
    char *arena;     /* ARENA_PAD zero bytes, then every name, back to back */
    int32_t *offset; /* per slot: where its name starts in the arena */
    int32_t *length; /* per slot: its length (-1: unused slot) */
    Py_ssize_t count;
} NameTable;

static void NameTable_free(NameTable *self) {
    PyMem_Free(self->buckets);
    PyMem_Free(self->arena);
    PyMem_Free(self->offset);
    PyMem_Free(self->length);
    self->buckets = NULL;
    self->arena = NULL;
    self->offset = self->length = NULL;
}

static void NameTable_dealloc(NameTable *self) {
    NameTable_free(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Whether slot's name is the len bytes at name (lo: where the memory of name starts). */
static inline int same_name(NameTable *self, int32_t slot, const char *name, Py_ssize_t len,
                            const char *lo) {
    if (self->length[slot] != len) return 0;
    /* Inline, eight bytes at a time: memcmp's call costs more than a short name. */
    const char *known = self->arena + self->offset[slot];
    while (len >= 8) {
        if (load64(known) != load64(name)) return 0;
        known += 8;
        name += 8;
        len -= 8;
    }
    return load_short(known, len, self->arena) == load_short(name, len, lo);
}

/* NameTable(names): names[i] is the node name of slot i, or None for an unused slot (slot 0,
 * the inventory's sentinel, is always unused). Names must be distinct. */
static int NameTable_init(NameTable *self, PyObject *args, PyObject *kwargs) {
    PyObject *names;
    static char *kwlist[] = {"names", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:NameTable", kwlist, &names)) return -1;
    PyObject *seq = PySequence_Fast(names, "names must be a sequence");
    if (seq == NULL) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > INT32_MAX) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "too many slots");
        return -1;
    }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t total = 0, count = 0;
    for (Py_ssize_t i = 1; i < n; i++) { /* slot 0 is the sentinel, never a name */
        if (items[i] == Py_None) continue;
        if (!PyUnicode_Check(items[i])) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "names must be str or None");
            return -1;
        }
        Py_ssize_t len;
        if (PyUnicode_AsUTF8AndSize(items[i], &len) == NULL) {
            Py_DECREF(seq);
            return -1;
        }
        total += len;
        count++;
    }
    if (total > INT32_MAX - ARENA_PAD) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "names too long");
        return -1;
    }
    Py_ssize_t capacity = 16;
    while (capacity < 2 * count) capacity <<= 1; /* load factor <= 1/2 */
    NameTable_free(self);
    self->buckets = PyMem_Calloc((size_t)capacity, sizeof(Bucket));
    self->arena = PyMem_Calloc((size_t)(total + ARENA_PAD), 1);
    self->offset = PyMem_Calloc((size_t)(n ? n : 1), sizeof(int32_t));
    self->length = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    self->mask = capacity - 1;
    self->count = 0;
    if (self->buckets == NULL || self->arena == NULL || self->offset == NULL ||
        self->length == NULL) {
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) self->length[i] = -1;
    Py_ssize_t offset = ARENA_PAD;
    for (Py_ssize_t i = 1; i < n; i++) {
        if (items[i] == Py_None) continue;
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(items[i], &len);
        uint64_t h = hash_bytes(s, len, s);
        uint32_t tag = (uint32_t)(h >> 32);
        Py_ssize_t k = (Py_ssize_t)(h & (uint64_t)self->mask);
        while (self->buckets[k].slot != 0) {
            Bucket *b = &self->buckets[k];
            if (b->tag == tag && same_name(self, b->slot, s, len, s)) {
                Py_DECREF(seq);
                PyErr_Format(PyExc_ValueError, "node name %R appears twice", items[i]);
                return -1;
            }
            k = (k + 1) & self->mask;
        }
        memcpy(self->arena + offset, s, (size_t)len);
        self->offset[i] = (int32_t)offset;
        self->length[i] = (int32_t)len;
        self->buckets[k] = (Bucket){tag, (int32_t)i};
        offset += len;
        self->count++;
    }
    Py_DECREF(seq);
    return 0;
}

static int32_t lookup(NameTable *self, const char *name, Py_ssize_t len, const char *lo) {
    uint64_t h = hash_bytes(name, len, lo);
    uint32_t tag = (uint32_t)(h >> 32);
    Py_ssize_t k = (Py_ssize_t)(h & (uint64_t)self->mask);
    for (;;) {
        Bucket *b = &self->buckets[k];
        if (b->slot == 0) return 0;
        if (b->tag == tag && same_name(self, b->slot, name, len, lo)) return b->slot;
        k = (k + 1) & self->mask;
    }
}

/* table.resolve(buf, names) -> bytearray: the slot of every name (scan()'s pairs), as native
 * int32; 0 for a name the table does not hold.
 *
 * In three passes rather than one lookup after another: a lookup is three dependent reads at
 * random places (bucket, the slot's record, its bytes), so each pass prefetches what the next
 * one reads, and the reads of many names are in flight at once. */
static PyObject *NameTable_resolve(NameTable *self, PyObject *args) {
    PyObject *buf, *pairs;
    if (!PyArg_ParseTuple(args, "OO:resolve", &buf, &pairs)) return NULL;
    Names names;
    if (get_names(buf, pairs, &names) < 0) return NULL;
    Py_ssize_t n = names.count;
    PyObject *out = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(int32_t));
    uint64_t *hashes = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uint64_t));
    if (out == NULL || hashes == NULL) {
        Py_XDECREF(out);
        PyMem_Free(hashes);
        release_names(&names);
        return PyErr_NoMemory();
    }
    int32_t *ids = (int32_t *)PyByteArray_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        const Name *m = &names.name[i];
        uint64_t h = hash_bytes(names.base + m->offset, m->length, names.base);
        hashes[i] = h;
        __builtin_prefetch(&self->buckets[h & (uint64_t)self->mask]);
    }
    /* The first candidate of each name: its slot, or -1 when the first bucket is not it (an
     * unknown name, or one further along the probe sequence: the last pass finds it). */
    for (Py_ssize_t i = 0; i < n; i++) {
        const Bucket *b = &self->buckets[hashes[i] & (uint64_t)self->mask];
        int32_t slot = b->tag == (uint32_t)(hashes[i] >> 32) ? b->slot : -1;
        ids[i] = slot;
        if (slot > 0) __builtin_prefetch(&self->offset[slot]);
    }
    for (Py_ssize_t i = 0; i < n; i++)
        if (ids[i] > 0) __builtin_prefetch(self->arena + self->offset[ids[i]]);
    for (Py_ssize_t i = 0; i < n; i++) {
        const Name *m = &names.name[i];
        const char *name = names.base + m->offset;
        if (ids[i] > 0 && same_name(self, ids[i], name, m->length, names.base)) continue;
        ids[i] = lookup(self, name, m->length, names.base);
    }
    PyMem_Free(hashes);
    release_names(&names);
    return out;
}

static Py_ssize_t NameTable_len(NameTable *self) { return self->count; }

static PyMethodDef NameTable_methods[] = {
    {"resolve", (PyCFunction)NameTable_resolve, METH_VARARGS,
     "resolve(buf, names) -> bytearray of int32 slots (0: unknown)"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods NameTable_as_sequence = {.sq_length = (lenfunc)NameTable_len};

static PyTypeObject NameTableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "extender._packed.NameTable",
    .tp_basicsize = sizeof(NameTable),
    .tp_dealloc = (destructor)NameTable_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Node name -> inventory slot, for names read in place from a request body.",
    .tp_methods = NameTable_methods,
    .tp_as_sequence = &NameTable_as_sequence,
    .tp_init = (initproc)NameTable_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------ writing answers */

/* memcpy for the short pieces of an answer (names, separators, messages), inline: a call to
 * memcpy per piece costs more than copying it. Returns the end of the copy. */
static inline char *put(char *w, const char *s, Py_ssize_t len) {
    while (len >= 8) {
        uint64_t v = load64(s);
        memcpy(w, &v, 8);
        w += 8;
        s += 8;
        len -= 8;
    }
    while (len--) *w++ = *s++;
    return w;
}

/* render(buf, names, codes, code, suffix, sep) -> bytes: '"name"' + suffix for every name i
 * with codes[i] == code, joined by sep; codes is an int8 buffer, one code per name. */
static PyObject *render(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *buf, *pairs, *codes_obj;
    int code;
    const char *suffix, *sep;
    Py_ssize_t suffix_len, sep_len;
    if (!PyArg_ParseTuple(args, "OOOiy#y#:render", &buf, &pairs, &codes_obj, &code, &suffix,
                          &suffix_len, &sep, &sep_len))
        return NULL;
    Names names;
    if (get_names(buf, pairs, &names) < 0) return NULL;
    Py_buffer codes_view;
    if (get_buffer(codes_obj, &codes_view) < 0) {
        release_names(&names);
        return NULL;
    }
    PyObject *out = NULL;
    const signed char *codes = (const signed char *)codes_view.buf;
    if (codes_view.len != names.count) {
        PyErr_SetString(PyExc_ValueError, "codes must hold exactly one int8 per name");
        goto done;
    }
    Py_ssize_t size = 0, chosen = 0;
    for (Py_ssize_t i = 0; i < names.count; i++) {
        if (codes[i] != code) continue;
        size += names.name[i].length + 2 + suffix_len;
        chosen++;
    }
    if (chosen > 1) size += (chosen - 1) * sep_len;
    out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) goto done;
    char *w = PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0, written = 0; i < names.count; i++) {
        if (codes[i] != code) continue;
        if (written++) w = put(w, sep, sep_len);
        const Name *m = &names.name[i];
        *w++ = '"';
        w = put(w, names.base + m->offset, m->length);
        *w++ = '"';
        w = put(w, suffix, suffix_len);
    }
done:
    PyBuffer_Release(&codes_view);
    release_names(&names);
    return out;
}

/* render_sections(buf, names, codes, placements, texts) -> bytes: a whole answer in one
 * buffer. placements[k] is None (names of code k are left out) or (section, suffix): every
 * name i with codes[i] == k is written as '"name"' + suffix into that section, in input order,
 * ',' between the entries of a section. The answer is texts[0] + section 0 + texts[1] + ...
 * + texts[n], n = len(texts) - 1 sections. Filter's answer is a few sections (NodeNames and the
 * two maps of rejected nodes) of thousands of names: sized first, then written once, with no
 * intermediate group to copy. */
#define MAX_GROUPS 128
#define MAX_SECTIONS 8
static PyObject *render_sections(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *buf, *pairs, *codes_obj, *placements_obj, *texts_obj;
    if (!PyArg_ParseTuple(args, "OOOOO:render_sections", &buf, &pairs, &codes_obj,
                          &placements_obj, &texts_obj))
        return NULL;
    PyObject *placements = PySequence_Fast(placements_obj, "placements must be a sequence");
    if (placements == NULL) return NULL;
    PyObject *texts = PySequence_Fast(texts_obj, "texts must be a sequence");
    if (texts == NULL) {
        Py_DECREF(placements);
        return NULL;
    }
    PyObject *out = NULL;
    Py_buffer codes_view = {0};
    Names names;
    int have_names = 0;
    Py_ssize_t groups = PySequence_Fast_GET_SIZE(placements);
    Py_ssize_t sections = PySequence_Fast_GET_SIZE(texts) - 1;
    if (groups > MAX_GROUPS || sections < 0 || sections > MAX_SECTIONS) {
        PyErr_SetString(PyExc_ValueError, "at most 128 codes, and 1 to 9 texts");
        goto done;
    }
    int section_of[MAX_GROUPS];
    const char *suffix[MAX_GROUPS];
    Py_ssize_t suffix_len[MAX_GROUPS];
    for (Py_ssize_t k = 0; k < groups; k++) {
        PyObject *item = PySequence_Fast_GET_ITEM(placements, k);
        section_of[k] = -1;
        if (item == Py_None) continue;
        PyObject *suffix_obj;
        Py_ssize_t section;
        if (!PyTuple_Check(item) || !PyArg_ParseTuple(item, "nO!", &section, &PyBytes_Type,
                                                      &suffix_obj)) {
            PyErr_Clear();
            PyErr_SetString(PyExc_TypeError, "a placement is None or (section, bytes)");
            goto done;
        }
        if (section < 0 || section >= sections) {
            PyErr_SetString(PyExc_ValueError, "a placement names a section out of range");
            goto done;
        }
        section_of[k] = (int)section;
        suffix[k] = PyBytes_AS_STRING(suffix_obj);
        suffix_len[k] = PyBytes_GET_SIZE(suffix_obj);
    }
    Py_ssize_t total = 0;
    for (Py_ssize_t t = 0; t <= sections; t++) {
        PyObject *text = PySequence_Fast_GET_ITEM(texts, t);
        if (!PyBytes_Check(text)) {
            PyErr_SetString(PyExc_TypeError, "texts must be bytes");
            goto done;
        }
        total += PyBytes_GET_SIZE(text);
    }
    if (get_names(buf, pairs, &names) < 0) goto done;
    have_names = 1;
    if (get_buffer(codes_obj, &codes_view) < 0) goto done;
    const signed char *codes = (const signed char *)codes_view.buf;
    if (codes_view.len != names.count) {
        PyErr_SetString(PyExc_ValueError, "codes must hold exactly one int8 per name");
        goto done;
    }
    Py_ssize_t size[MAX_SECTIONS] = {0}, count[MAX_SECTIONS] = {0};
    for (Py_ssize_t i = 0; i < names.count; i++) {
        int k = codes[i];
        if (k < 0 || k >= groups || section_of[k] < 0) continue;
        int s = section_of[k];
        size[s] += names.name[i].length + 2 + suffix_len[k];
        count[s]++;
    }
    char *cursor[MAX_SECTIONS];
    for (Py_ssize_t s = 0; s < sections; s++) total += size[s] + (count[s] ? count[s] - 1 : 0);
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) goto done;
    char *w = PyBytes_AS_STRING(out);
    for (Py_ssize_t t = 0; t <= sections; t++) { /* the texts, and where each section starts */
        PyObject *text = PySequence_Fast_GET_ITEM(texts, t);
        memcpy(w, PyBytes_AS_STRING(text), (size_t)PyBytes_GET_SIZE(text));
        w += PyBytes_GET_SIZE(text);
        if (t < sections) {
            cursor[t] = w;
            w += size[t] + (count[t] ? count[t] - 1 : 0);
        }
    }
    for (Py_ssize_t i = 0; i < names.count; i++) {
        int k = codes[i];
        if (k < 0 || k >= groups || section_of[k] < 0) continue;
        int s = section_of[k];
        const Name *m = &names.name[i];
        char *p = cursor[s];
        *p++ = '"';
        p = put(p, names.base + m->offset, m->length);
        *p++ = '"';
        p = put(p, suffix[k], suffix_len[k]);
        if (--count[s]) *p++ = ','; /* more of this section follow */
        cursor[s] = p;
    }
done:
    if (codes_view.obj != NULL) PyBuffer_Release(&codes_view);
    if (have_names) release_names(&names);
    Py_DECREF(placements);
    Py_DECREF(texts);
    return out;
}

/* Decimal digits of v at w; returns how many bytes were written (at most 20). */
static Py_ssize_t format_int(char *w, int64_t v) {
    char digits[20];
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    Py_ssize_t n = 0, written = 0;
    do {
        digits[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    if (v < 0) w[written++] = '-';
    while (n) w[written++] = digits[--n];
    return written;
}

/* render_scores(buf, names, scores) -> bytes: '{"Host":"name","Score":s}' for every name whose
 * score is not 0, joined by ','; scores is an int64 buffer, one score per name. kube-scheduler
 * adds each listed host's score to that host's total, so an entry with 0 adds nothing. */
static PyObject *render_scores(PyObject *self, PyObject *args) {
    (void)self;
    static const char head[] = "{\"Host\":\"";
    static const char middle[] = "\",\"Score\":";
    PyObject *buf, *pairs, *scores_obj;
    if (!PyArg_ParseTuple(args, "OOO:render_scores", &buf, &pairs, &scores_obj)) return NULL;
    Names names;
    if (get_names(buf, pairs, &names) < 0) return NULL;
    Py_buffer scores_view;
    if (get_buffer(scores_obj, &scores_view) < 0) {
        release_names(&names);
        return NULL;
    }
    PyObject *out = NULL;
    const int64_t *scores = (const int64_t *)scores_view.buf;
    if (scores_view.len != names.count * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "scores must hold exactly one int64 per name");
        goto done;
    }
    /* Per entry: a comma, the head, the name, the middle, at most 20 digits and a sign, '}'. */
    Py_ssize_t size = 0;
    for (Py_ssize_t i = 0; i < names.count; i++)
        size += names.name[i].length + (Py_ssize_t)(sizeof head + sizeof middle) + 22;
    out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL) goto done;
    char *begin = PyBytes_AS_STRING(out), *w = begin;
    for (Py_ssize_t i = 0; i < names.count; i++) {
        const Name *m = &names.name[i];
        if (scores[i] == 0) continue;
        if (w != begin) *w++ = ',';
        w = put(w, head, sizeof head - 1);
        w = put(w, names.base + m->offset, m->length);
        w = put(w, middle, sizeof middle - 1);
        w += format_int(w, scores[i]);
        *w++ = '}';
    }
    if (_PyBytes_Resize(&out, w - begin) < 0) out = NULL;
done:
    PyBuffer_Release(&scores_view);
    release_names(&names);
    return out;
}

/* ------------------------------------------------------------------ codes */

/* count_codes(codes, size) -> list: how many of the int8 codes are 0, 1, ... size - 1 (every
 * code must be in that range). numpy's bincount first widens the codes to intp: several times
 * slower on the few thousand a filter call has. */
static PyObject *count_codes(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *codes_obj;
    Py_ssize_t size;
    if (!PyArg_ParseTuple(args, "On:count_codes", &codes_obj, &size)) return NULL;
    if (size < 0 || size > 128) {
        PyErr_SetString(PyExc_ValueError, "size must be 0..128");
        return NULL;
    }
    Py_buffer view;
    if (get_buffer(codes_obj, &view) < 0) return NULL;
    /* Four tables, summed at the end: runs of one code (the usual case) would otherwise make
     * every increment wait for the one before it. */
    Py_ssize_t counts[4][128] = {{0}};
    const signed char *codes = (const signed char *)view.buf;
    unsigned char highest = 0;
    Py_ssize_t i = 0;
    for (; i + 4 <= view.len; i += 4) {
        for (int j = 0; j < 4; j++) {
            unsigned char k = (unsigned char)codes[i + j]; /* negative codes come out >= 128 */
            highest = k > highest ? k : highest;
            counts[j][k & 0x7f]++;
        }
    }
    for (; i < view.len; i++) {
        unsigned char k = (unsigned char)codes[i];
        highest = k > highest ? k : highest;
        counts[0][k & 0x7f]++;
    }
    int bad = view.len > 0 && highest >= size;
    PyBuffer_Release(&view);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "a code outside 0..size-1");
        return NULL;
    }
    PyObject *out = PyList_New(size);
    if (out == NULL) return NULL;
    for (Py_ssize_t k = 0; k < size; k++) {
        Py_ssize_t total = counts[0][k] + counts[1][k] + counts[2][k] + counts[3][k];
        PyObject *count = PyLong_FromSsize_t(total);
        if (count == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, k, count);
    }
    return out;
}

/* ------------------------------------------------------------------ module */

static PyMethodDef module_methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(buf, start, end) -> bytearray of (offset, length) int32 pairs, or None"},
    {"render", render, METH_VARARGS, "render(buf, names, codes, code, suffix, sep) -> bytes"},
    {"render_sections", render_sections, METH_VARARGS,
     "render_sections(buf, names, codes, placements, texts) -> bytes"},
    {"render_scores", render_scores, METH_VARARGS, "render_scores(buf, names, scores) -> bytes"},
    {"count_codes", count_codes, METH_VARARGS, "count_codes(codes, size) -> list of counts"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "extender._packed",
    .m_doc = "Node names read and written in place (see extender/packed.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__packed(void) {
    if (PyType_Ready(&NameTableType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&NameTableType);
    if (PyModule_AddObject(m, "NameTable", (PyObject *)&NameTableType) < 0) {
        Py_DECREF(&NameTableType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
