/* A small reader and writer of NumPy .npy files (format versions 1, 2 and 3), for the tools and tests that
 * exchange tensors with Python. Only what an engine dump needs: little-endian <f4, <u2 (bf16 bits), <f2,
 * <i4 and <i8, and |u1 (fp8 bits; one byte has no byte order), C order. Anything else is refused with a message, never guessed at. */
#ifndef UATTN_NPY_H
#define UATTN_NPY_H

#include <stddef.h>
#include <stdint.h>

#define NPY_MAX_DIMS 32 /* NumPy 1.x's NPY_MAXDIMS */

typedef enum npy_dtype {
  NPY_F4 = 0, /* <f4 float32 */
  NPY_U2 = 1, /* <u2 uint16; bf16 tensors travel as their bits */
  NPY_F2 = 2, /* <f2 IEEE binary16 */
  NPY_I4 = 3, /* <i4 int32 */
  NPY_I8 = 4, /* <i8 int64 */
  NPY_U1 = 5, /* |u1 uint8; fp8 caches travel as their bits */
} npy_dtype;

typedef struct npy_array {
  npy_dtype dtype;
  int ndim; /* 0 for a scalar */
  int64_t shape[NPY_MAX_DIMS];
  size_t count; /* elements: the product of shape (1 for a scalar) */
  void *data;   /* count elements, dense, C order; never NULL after a successful read */
} npy_array;

/* "<f4" and so on. */
const char *npy_dtype_descr(npy_dtype dtype);
/* Bytes per element; 0 for an unknown dtype. */
size_t npy_dtype_size(npy_dtype dtype);

/* Reads a whole file. Returns 0, or -1 with a one-line reason in err (which does not repeat the path); *out
 * is then zeroed and owns nothing. Release a successful read with npy_free. */
int npy_read(const char *path, npy_array *out, char *err, size_t errlen);

/* Writes data (count = product of shape elements; may be NULL when that is 0) as a version 1 file, or 2
 * when the header needs it. Returns 0, or -1 with a reason in err; a failed write leaves no file behind. */
int npy_write(const char *path, npy_dtype dtype, int ndim, const int64_t *shape, const void *data, char *err,
              size_t errlen);

/* Frees the data of a read; the array is zeroed. NULL or an already freed array is fine. */
void npy_free(npy_array *array);

#endif
