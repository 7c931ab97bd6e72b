/* .npy files: a magic string, a version, a header that is a Python dict literal, then the raw data.
 * Format: https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html */
#include "support/npy.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "support/fail.h"

/* Data is copied byte for byte, which is only right where the host's order is the files' ("<"). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "npy.c reads and writes little-endian data without swapping: port it before using it on this host"
#endif

static const char npy_magic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
/* NumPy itself refuses headers over 10000 bytes unless told otherwise; anything near this is not a dump. */
#define NPY_HEADER_LIMIT (1u << 20)

static const struct {
  const char *descr;
  size_t size;
} npy_types[] = {{"<f4", 4}, {"<u2", 2}, {"<f2", 2}, {"<i4", 4}, {"<i8", 8}, {"|u1", 1}};
#define NPY_NUM_TYPES (sizeof npy_types / sizeof *npy_types)

const char *npy_dtype_descr(npy_dtype dtype) { return (unsigned)dtype < NPY_NUM_TYPES ? npy_types[dtype].descr : "?"; }

size_t npy_dtype_size(npy_dtype dtype) { return (unsigned)dtype < NPY_NUM_TYPES ? npy_types[dtype].size : 0; }

/* ---- the header: a Python dict literal ---------------------------------------------------------------- */

/* A cursor over the header text, which is not NUL-terminated where we are concerned: every read is bounded. */
typedef struct cursor {
  const char *s;
  size_t n, i;
  char *err;
  size_t errlen;
} cursor;

static void skip_ws(cursor *c) {
  while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' || c->s[c->i] == '\r')) c->i++;
}

static bool peek_is(cursor *c, char ch) {
  skip_ws(c);
  return c->i < c->n && c->s[c->i] == ch;
}

static int expect(cursor *c, char ch, const char *after) {
  if (peek_is(c, ch)) {
    c->i++;
    return 0;
  }
  if (c->i >= c->n) return fail_with(c->err, c->errlen, "header: ends where '%c' was expected %s", ch, after);
  return fail_with(c->err, c->errlen, "header: expected '%c' %s at byte %zu, found '%c'", ch, after, c->i, c->s[c->i]);
}

/* A quoted string (either quote). The header holds only identifiers and type codes, so an escape means
 * this is not a header we understand. */
static int parse_string(cursor *c, char *out, size_t cap, const char *what) {
  skip_ws(c);
  if (c->i >= c->n || (c->s[c->i] != '\'' && c->s[c->i] != '"'))
    return fail_with(c->err, c->errlen, "header: expected a quoted string for %s at byte %zu", what, c->i);
  const char quote = c->s[c->i++];
  size_t len = 0;
  for (;; c->i++) {
    if (c->i >= c->n || c->s[c->i] == '\n')
      return fail_with(c->err, c->errlen, "header: unterminated string for %s", what);
    const char ch = c->s[c->i];
    if (ch == quote) break;
    if (ch == '\\') return fail_with(c->err, c->errlen, "header: escape sequence in %s is not supported", what);
    if (len + 1 >= cap) return fail_with(c->err, c->errlen, "header: string for %s is too long", what);
    out[len++] = ch;
  }
  c->i++;
  out[len] = '\0';
  return 0;
}

static bool take_word(cursor *c, const char *word) {
  skip_ws(c);
  const size_t len = strlen(word);
  if (c->n - c->i < len || memcmp(c->s + c->i, word, len) != 0) return false;
  /* "Trueish" is not True */
  const size_t end = c->i + len;
  if (end < c->n) {
    const char ch = c->s[end];
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_') return false;
  }
  c->i = end;
  return true;
}

static int parse_bool(cursor *c, bool *out) {
  if (take_word(c, "True"))
    *out = true;
  else if (take_word(c, "False"))
    *out = false;
  else
    return fail_with(c->err, c->errlen, "header: 'fortran_order' must be True or False (byte %zu)", c->i);
  return 0;
}

/* A tuple of non-negative integers: (), (3,), (3, 4) or (3, 4,). */
static int parse_shape(cursor *c, int *ndim, int64_t *shape) {
  skip_ws(c);
  if (c->i >= c->n || c->s[c->i] != '(')
    return fail_with(c->err, c->errlen, "header: 'shape' must be a tuple such as (3, 4) (byte %zu)", c->i);
  c->i++;
  int nd = 0;
  bool trailing_comma = false;
  while (!peek_is(c, ')')) {
    if (nd == NPY_MAX_DIMS)
      return fail_with(c->err, c->errlen, "header: 'shape' has more than %d dimensions", NPY_MAX_DIMS);
    skip_ws(c);
    if (c->i < c->n && c->s[c->i] == '-')
      return fail_with(c->err, c->errlen, "header: 'shape' has a negative dimension (byte %zu)", c->i);
    if (c->i >= c->n || c->s[c->i] < '0' || c->s[c->i] > '9')
      return fail_with(c->err, c->errlen, "header: 'shape' holds something other than an integer (byte %zu)", c->i);
    int64_t v = 0;
    while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') {
      if (v > (INT64_MAX - 9) / 10) return fail_with(c->err, c->errlen, "header: a dimension of 'shape' overflows");
      v = v * 10 + (c->s[c->i++] - '0');
    }
    shape[nd++] = v;
    trailing_comma = false;
    if (peek_is(c, ',')) {
      c->i++;
      trailing_comma = true;
    } else if (!peek_is(c, ')')) {
      return fail_with(c->err, c->errlen, "header: expected ',' or ')' in 'shape' at byte %zu", c->i);
    }
  }
  c->i++;
  /* Python reads (3) as the integer 3, and NumPy then refuses it */
  if (nd == 1 && !trailing_comma)
    return fail_with(c->err, c->errlen, "header: 'shape' (%lld) is not a tuple: a 1-d shape is written (%lld,)",
                     (long long)shape[0], (long long)shape[0]);
  *ndim = nd;
  return 0;
}

typedef struct header {
  char descr[32];
  bool fortran_order;
  int ndim;
  int64_t shape[NPY_MAX_DIMS];
} header;

static int parse_header(const char *text, size_t len, header *h, char *err, size_t errlen) {
  cursor c = {text, len, 0, err, errlen};
  bool seen_descr = false, seen_fortran = false, seen_shape = false;
  if (expect(&c, '{', "to open the header dict")) return -1;
  while (!peek_is(&c, '}')) {
    char key[32];
    if (parse_string(&c, key, sizeof key, "a key")) return -1;
    if (expect(&c, ':', "after a key")) return -1;
    bool *seen;
    if (strcmp(key, "descr") == 0) {
      seen = &seen_descr;
      if (peek_is(&c, '['))
        return fail_with(err, errlen, "header: 'descr' is a structured dtype, which is not supported");
      if (parse_string(&c, h->descr, sizeof h->descr, "'descr'")) return -1;
    } else if (strcmp(key, "fortran_order") == 0) {
      seen = &seen_fortran;
      if (parse_bool(&c, &h->fortran_order)) return -1;
    } else if (strcmp(key, "shape") == 0) {
      seen = &seen_shape;
      if (parse_shape(&c, &h->ndim, h->shape)) return -1;
    } else {
      /* NumPy refuses extra keys too: such a file was not written by np.save */
      return fail_with(err, errlen,
                       "header: unexpected key '%s' (a .npy header has 'descr', 'fortran_order' "
                       "and 'shape')",
                       key);
    }
    if (*seen) return fail_with(err, errlen, "header: key '%s' appears twice", key);
    *seen = true;
    if (peek_is(&c, ','))
      c.i++;
    else if (!peek_is(&c, '}'))
      return expect(&c, '}', "after a value");
  }
  c.i++;
  skip_ws(&c);
  if (c.i != c.n) return fail_with(err, errlen, "header: unexpected text after the dict at byte %zu", c.i);
  if (!seen_descr) return fail_with(err, errlen, "header: missing key 'descr'");
  if (!seen_fortran) return fail_with(err, errlen, "header: missing key 'fortran_order'");
  if (!seen_shape) return fail_with(err, errlen, "header: missing key 'shape'");
  return 0;
}

static int dtype_from_descr(const char *descr, npy_dtype *out, char *err, size_t errlen) {
  for (size_t i = 0; i < NPY_NUM_TYPES; i++)
    if (strcmp(descr, npy_types[i].descr) == 0) {
      *out = (npy_dtype)i;
      return 0;
    }
  if (descr[0] == '>')
    return fail_with(err, errlen,
                     "big-endian data ('%s') is not supported: save it little-endian, e.g. "
                     "a.astype(a.dtype.newbyteorder('<'))",
                     descr);
  return fail_with(err, errlen, "dtype '%s' is not supported (supported: <f4, <u2, <f2, <i4, <i8, |u1)", descr);
}

/* Element count and byte size of a shape, refusing what does not fit in size_t. */
static int shape_size(int ndim, const int64_t *shape, size_t itemsize, size_t *count, size_t *bytes, char *err,
                      size_t errlen) {
  size_t n = 1;
  bool zero = false;
  for (int d = 0; d < ndim; d++) {
    if (shape[d] < 0) return fail_with(err, errlen, "dimension %d is negative (%lld)", d, (long long)shape[d]);
    if (shape[d] == 0) zero = true;
  }
  if (zero)
    n = 0;
  else
    for (int d = 0; d < ndim; d++) {
      if ((uint64_t)shape[d] > SIZE_MAX / n) return fail_with(err, errlen, "the shape's element count overflows");
      n *= (size_t)shape[d];
    }
  if (n > SIZE_MAX / itemsize) return fail_with(err, errlen, "the array's byte size overflows");
  *count = n;
  *bytes = n * itemsize;
  return 0;
}

static uint32_t le_u32(const unsigned char *b) {
  return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* ---- read --------------------------------------------------------------------------------------------- */

int npy_read(const char *path, npy_array *out, char *err, size_t errlen) {
  if (!out) return fail_with(err, errlen, "no output array");
  memset(out, 0, sizeof *out);
  if (!path) return fail_with(err, errlen, "no path");
  FILE *f = fopen(path, "rb");
  if (!f) return fail_with(err, errlen, "cannot open: %s", strerror(errno));
  char *text = NULL;
  void *data = NULL;
  int rc = -1;

  unsigned char pre[12];
  if (fread(pre, 1, 8, f) != 8 || memcmp(pre, npy_magic, sizeof npy_magic) != 0) {
    fail_with(err, errlen, "not a .npy file (no \\x93NUMPY magic)");
    goto done;
  }
  const int major = pre[6], minor = pre[7];
  uint32_t hlen;
  if (major == 1) {
    if (fread(pre + 8, 1, 2, f) != 2) {
      fail_with(err, errlen, "truncated header");
      goto done;
    }
    hlen = (uint32_t)pre[8] | (uint32_t)pre[9] << 8;
  } else if (major == 2 || major == 3) { /* 3 differs from 2 only in allowing UTF-8, which we never need */
    if (fread(pre + 8, 1, 4, f) != 4) {
      fail_with(err, errlen, "truncated header");
      goto done;
    }
    hlen = le_u32(pre + 8);
  } else {
    fail_with(err, errlen, "unsupported .npy format version %d.%d (supported: 1.0, 2.0, 3.0)", major, minor);
    goto done;
  }
  if (hlen > NPY_HEADER_LIMIT) {
    fail_with(err, errlen, "header length %u is implausible (over %u bytes)", hlen, NPY_HEADER_LIMIT);
    goto done;
  }
  text = malloc((size_t)hlen + 1);
  if (!text) {
    fail_with(err, errlen, "out of memory");
    goto done;
  }
  if (fread(text, 1, hlen, f) != hlen) {
    fail_with(err, errlen, "truncated header (%u bytes announced)", hlen);
    goto done;
  }
  text[hlen] = '\0';

  header h;
  memset(&h, 0, sizeof h);
  if (parse_header(text, hlen, &h, err, errlen)) goto done;
  npy_dtype dtype = NPY_F4;
  if (dtype_from_descr(h.descr, &dtype, err, errlen)) goto done;
  if (h.fortran_order) {
    fail_with(err, errlen, "fortran_order is True: only C-order arrays are supported (save np.ascontiguousarray(a))");
    goto done;
  }
  size_t count, bytes;
  if (shape_size(h.ndim, h.shape, npy_dtype_size(dtype), &count, &bytes, err, errlen)) goto done;

  /* Compare with the file's size before allocating, so a corrupt shape cannot ask for terabytes. */
  const off_t start = ftello(f);
  if (start < 0 || fseeko(f, 0, SEEK_END) != 0) {
    fail_with(err, errlen, "cannot seek: %s", strerror(errno));
    goto done;
  }
  const off_t end = ftello(f);
  if (end < start || fseeko(f, start, SEEK_SET) != 0) {
    fail_with(err, errlen, "cannot seek: %s", strerror(errno));
    goto done;
  }
  const uint64_t avail = (uint64_t)(end - start);
  if (avail < bytes) {
    fail_with(err, errlen, "truncated data: shape and dtype need %zu bytes, the file has %llu", bytes,
              (unsigned long long)avail);
    goto done;
  }
  if (avail > bytes) {
    fail_with(err, errlen, "%llu bytes after the data that shape and dtype describe (%zu bytes)",
              (unsigned long long)(avail - bytes), bytes);
    goto done;
  }
  data = malloc(bytes ? bytes : 1);
  if (!data) {
    fail_with(err, errlen, "out of memory for %zu bytes", bytes);
    goto done;
  }
  if (bytes && fread(data, 1, bytes, f) != bytes) {
    fail_with(err, errlen, "read error: %s", ferror(f) ? strerror(errno) : "short read");
    goto done;
  }

  out->dtype = dtype;
  out->ndim = h.ndim;
  memcpy(out->shape, h.shape, sizeof h.shape);
  out->count = count;
  out->data = data;
  data = NULL;
  rc = 0;
done:
  free(data);
  free(text);
  fclose(f);
  return rc;
}

void npy_free(npy_array *array) {
  if (!array) return;
  free(array->data);
  memset(array, 0, sizeof *array);
}

/* ---- write -------------------------------------------------------------------------------------------- */

int npy_write(const char *path, npy_dtype dtype, int ndim, const int64_t *shape, const void *data, char *err,
              size_t errlen) {
  if (!path) return fail_with(err, errlen, "no path");
  const size_t itemsize = npy_dtype_size(dtype);
  if (!itemsize) return fail_with(err, errlen, "unknown dtype %d", (int)dtype);
  if (ndim < 0 || ndim > NPY_MAX_DIMS) return fail_with(err, errlen, "ndim %d is outside [0, %d]", ndim, NPY_MAX_DIMS);
  if (ndim > 0 && !shape) return fail_with(err, errlen, "no shape");
  size_t count, bytes;
  if (shape_size(ndim, shape, itemsize, &count, &bytes, err, errlen)) return -1;
  if (count && !data) return fail_with(err, errlen, "no data for %zu elements", count);

  /* NumPy's own layout: the dict, space padding, a newline, the whole preamble a multiple of 64 bytes so
   * the data is aligned for memory mapping. */
  char dict[64 + NPY_MAX_DIMS * 24];
  int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (", npy_dtype_descr(dtype));
  for (int d = 0; d < ndim; d++)
    len += snprintf(dict + len, sizeof dict - (size_t)len, d ? ", %lld" : "%lld", (long long)shape[d]);
  len += snprintf(dict + len, sizeof dict - (size_t)len, "%s), }", ndim == 1 ? "," : "");
  size_t prefix = 10; /* magic 6, version 2, length 2 */
  size_t hlen = ((prefix + (size_t)len + 1 + 63) / 64) * 64 - prefix;
  int major = 1;
  if (hlen > 0xffff) { /* cannot happen with NPY_MAX_DIMS dimensions; kept so the format stays right */
    major = 2;
    prefix = 12;
    hlen = ((prefix + (size_t)len + 1 + 63) / 64) * 64 - prefix;
  }
  unsigned char pre[12];
  memcpy(pre, npy_magic, sizeof npy_magic);
  pre[6] = (unsigned char)major;
  pre[7] = 0;
  for (size_t b = 0; b < prefix - 8; b++) pre[8 + b] = (unsigned char)(hlen >> (8 * b));

  char *text = malloc(hlen);
  if (!text) return fail_with(err, errlen, "out of memory");
  memcpy(text, dict, (size_t)len);
  memset(text + len, ' ', hlen - (size_t)len - 1);
  text[hlen - 1] = '\n';

  FILE *f = fopen(path, "wb");
  if (!f) {
    free(text);
    return fail_with(err, errlen, "cannot create: %s", strerror(errno));
  }
  bool ok = fwrite(pre, 1, prefix, f) == prefix && fwrite(text, 1, hlen, f) == hlen &&
            (bytes == 0 || fwrite(data, 1, bytes, f) == bytes);
  const int saved = errno;
  free(text);
  if (fclose(f) != 0 && ok) {
    ok = false;
    fail_with(err, errlen, "cannot write: %s", strerror(errno));
  } else if (!ok) {
    fail_with(err, errlen, "cannot write: %s", strerror(saved));
  }
  /* a half-written file would claim to be an array; only a regular file is ours to delete (a device such as
   * /dev/stdout may be the destination) */
  struct stat st;
  if (!ok && stat(path, &st) == 0 && S_ISREG(st.st_mode)) remove(path);
  return ok ? 0 : -1;
}
