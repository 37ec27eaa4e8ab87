/* Structural pre-scan of a msgpack header before msgpack-c unpacks it.
 *
 * Why: msgpack-c 4.0 allocates every array/map from its *declared* count
 * before reading the elements (24 or 48 bytes per element), so a 5-byte
 * frame declaring array32(10^7) costs 256 MiB, and it has no C-API limit
 * for counts or objects. This walk only reads type bytes and lengths (it
 * decodes no values) and rejects a declared count larger than the bytes
 * left (every element takes at least one byte), more than
 * TP_PROTO_MAX_OBJECTS objects, nesting deeper than TP_PROTO_MAX_DEPTH, a
 * truncated value, the reserved byte 0xc1, and trailing bytes. */
#include "schema.h"

static uint64_t be(const uint8_t *p, unsigned n)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < n; i++)
        v = v << 8 | p[i];
    return v;
}

/* For type byte b: bytes of its length field (lenb), fixed payload bytes
 * (fixed), whether the length field counts payload bytes (is_blob) or
 * elements (elems_per: 1 array, 2 map). Returns 0 for a reserved byte. */
static int classify(uint8_t b, unsigned *lenb, uint64_t *fixed, int *is_blob, unsigned *elems_per)
{
    *lenb = 0, *fixed = 0, *is_blob = 0, *elems_per = 0;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3)
        return 1;
    if (b <= 0x8f) return *fixed = b & 0x0f, *elems_per = 2, 2;   /* fixmap: count inline */
    if (b <= 0x9f) return *fixed = b & 0x0f, *elems_per = 1, 2;   /* fixarray */
    if (b <= 0xbf) return *fixed = b & 0x1f, 1;                   /* fixstr */
    switch (b) {
    case 0xc4: case 0xd9: return *lenb = 1, *is_blob = 1, 1;      /* bin8, str8 */
    case 0xc5: case 0xda: return *lenb = 2, *is_blob = 1, 1;
    case 0xc6: case 0xdb: return *lenb = 4, *is_blob = 1, 1;
    case 0xc7: return *lenb = 1, *is_blob = 1, *fixed = 1, 1;     /* ext8: + type byte */
    case 0xc8: return *lenb = 2, *is_blob = 1, *fixed = 1, 1;
    case 0xc9: return *lenb = 4, *is_blob = 1, *fixed = 1, 1;
    case 0xca: return *fixed = 4, 1;
    case 0xcb: return *fixed = 8, 1;
    case 0xcc: case 0xd0: return *fixed = 1, 1;
    case 0xcd: case 0xd1: return *fixed = 2, 1;
    case 0xce: case 0xd2: return *fixed = 4, 1;
    case 0xcf: case 0xd3: return *fixed = 8, 1;
    case 0xd4: return *fixed = 2, 1;                              /* fixext1..16: type + data */
    case 0xd5: return *fixed = 3, 1;
    case 0xd6: return *fixed = 5, 1;
    case 0xd7: return *fixed = 9, 1;
    case 0xd8: return *fixed = 17, 1;
    case 0xdc: return *lenb = 2, *elems_per = 1, 1;
    case 0xdd: return *lenb = 4, *elems_per = 1, 1;
    case 0xde: return *lenb = 2, *elems_per = 2, 1;
    case 0xdf: return *lenb = 4, *elems_per = 2, 1;
    default: return 0;                                            /* 0xc1: never used */
    }
}

int mp_prescan(const uint8_t *p, size_t len, tp_err *err)
{
    uint64_t pending[TP_PROTO_MAX_DEPTH + 1];
    int depth = 0;
    size_t pos = 0;
    uint64_t objects = 0;
    pending[0] = 1;
    while (depth >= 0) {
        if (pending[depth] == 0) {
            depth--;
            continue;
        }
        pending[depth]--;
        if (++objects > TP_PROTO_MAX_OBJECTS)
            return tp_err_set(err, TP_ERANGE, "header: more than %d msgpack objects", TP_PROTO_MAX_OBJECTS);
        if (pos >= len)
            return tp_err_set(err, TP_EFORMAT, "header: msgpack truncated at byte %zu", pos);
        uint8_t b = p[pos++];
        unsigned lenb, elems_per;
        uint64_t fixed;
        int is_blob;
        int kind = classify(b, &lenb, &fixed, &is_blob, &elems_per);
        if (!kind)
            return tp_err_set(err, TP_EFORMAT, "header: invalid msgpack type byte 0x%02x at byte %zu", b, pos - 1);
        if (len - pos < lenb)
            return tp_err_set(err, TP_EFORMAT, "header: msgpack truncated at byte %zu", pos);
        uint64_t count = lenb ? be(p + pos, lenb) : 0;
        pos += lenb;
        if (kind == 2)
            count = fixed, fixed = 0;  /* fix containers carry the count in the type byte */
        uint64_t skip = fixed + (is_blob ? count : 0);
        if (skip > len - pos)
            return tp_err_set(err, TP_EFORMAT, "header: msgpack value at byte %zu runs past the end", pos);
        pos += skip;
        if (!elems_per)
            continue;
        /* nesting counts containers on the path, empty ones too */
        if (depth >= TP_PROTO_MAX_DEPTH)
            return tp_err_set(err, TP_EFORMAT, "header: msgpack nested deeper than %d", TP_PROTO_MAX_DEPTH);
        uint64_t children = count * elems_per;
        if (children == 0)
            continue;
        if (children > len - pos)
            return tp_err_set(err, TP_EFORMAT,
                              "header: container at byte %zu declares %llu elements but only %zu bytes remain",
                              pos, (unsigned long long)children, len - pos);
        if (children > TP_PROTO_MAX_OBJECTS - objects)
            return tp_err_set(err, TP_ERANGE, "header: more than %d msgpack objects", TP_PROTO_MAX_OBJECTS);
        pending[++depth] = children;
    }
    if (pos != len)
        return tp_err_set(err, TP_EFORMAT, "header: %zu trailing bytes after the msgpack value", len - pos);
    return 0;
}
