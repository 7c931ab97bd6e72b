/*
 * The helpers every part of the module shares: taking an argument's memory (the buffer protocol, or
 * DLPack written out here so no header is needed) and checking its kind and shape with a message naming
 * the argument; making NumPy outputs and copies; the names of the library's dtypes.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "uattn_py.h"

/* ---- DLPack (the ABI every framework shares; written out here so no header is needed) ------------ */

enum { DL_CPU = 1 };
enum { DL_INT = 0, DL_UINT = 1, DL_FLOAT = 2, DL_BFLOAT = 4 };

typedef struct {
  int32_t device_type;
  int32_t device_id;
} dl_device;

typedef struct {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
} dl_dtype;

typedef struct {
  void *data;
  dl_device device;
  int32_t ndim;
  dl_dtype dtype;
  int64_t *shape;
  int64_t *strides; /* in elements; NULL = compact row-major */
  uint64_t byte_offset;
} dl_tensor;

typedef struct dl_managed_tensor {
  dl_tensor dl_tensor;
  void *manager_ctx;
  void (*deleter)(struct dl_managed_tensor *self);
} dl_managed_tensor;

/* ---- arrays ---------------------------------------------------------------------------------------- */

static const char *kind_name[] = {"another dtype", "float32", "float16", "bfloat16", "uint16",
                                  "float64",       "int32",   "int64",   "bool",     "uint8"};

void uattn_py_array_release(array *a) {
  if (a->has_view) PyBuffer_Release(&a->view);
  a->has_view = 0;
  if (a->dl && a->dl->deleter) a->dl->deleter(a->dl);
  a->dl = NULL;
  Py_CLEAR(a->owned);
}

static enum kind kind_of_format(const char *fmt, Py_ssize_t itemsize) {
  if (!fmt) return K_OTHER;                                /* no format: plain bytes */
  while (*fmt == '@' || *fmt == '=' || *fmt == '<') fmt++; /* native order: this module runs little-endian */
  if (fmt[0] == '\0' || fmt[1] != '\0') return K_OTHER;
  switch (fmt[0]) {
  case 'f': return itemsize == 4 ? K_F32 : K_OTHER;
  case 'd': return itemsize == 8 ? K_F64 : K_OTHER;
  case 'e': return itemsize == 2 ? K_F16 : K_OTHER;
  case 'H': return itemsize == 2 ? K_U16 : K_OTHER;
  case '?': return itemsize == 1 ? K_BOOL : K_OTHER;
  case 'B': return itemsize == 1 ? K_U8 : K_OTHER; /* fp8 caches travel as their bits */
  case 'b':
  case 'h':
  case 'i':
  case 'l':
  case 'q': return itemsize == 4 ? K_I32 : itemsize == 8 ? K_I64 : K_OTHER;
  default: return K_OTHER;
  }
}

static enum kind kind_of_dl(dl_dtype t) {
  if (t.lanes != 1) return K_OTHER;
  if (t.code == DL_FLOAT) return t.bits == 32 ? K_F32 : t.bits == 16 ? K_F16 : t.bits == 64 ? K_F64 : K_OTHER;
  if (t.code == DL_BFLOAT) return t.bits == 16 ? K_BF16 : K_OTHER;
  if (t.code == DL_INT) return t.bits == 32 ? K_I32 : t.bits == 64 ? K_I64 : K_OTHER;
  if (t.code == DL_UINT) return t.bits == 16 ? K_U16 : t.bits == 8 ? K_U8 : K_OTHER;
  return K_OTHER;
}

int uattn_py_fail_arg(const array *a, const char *fmt, ...) {
  char buf[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  PyErr_Format(PyExc_ValueError, "%s: %s", a->name, buf);
  return -1;
}

/* Takes obj's memory: the buffer protocol first (NumPy, memoryview), else __dlpack__ (PyTorch). Checks
 * that it is C-contiguous, on the CPU, of at most MAX_DIMS dimensions, and writable when asked. */
int uattn_py_array_get(array *a, PyObject *obj, const char *name, int writable) {
  memset(a, 0, sizeof *a);
  a->name = name;
  if (PyObject_CheckBuffer(obj)) {
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_STRIDES | PyBUF_FORMAT) != 0) {
      PyErr_Clear();
      return uattn_py_fail_arg(a, "its buffer cannot be read as a strided array");
    }
    a->has_view = 1;
    if (a->view.ndim > MAX_DIMS) return uattn_py_fail_arg(a, "more than %d dimensions", MAX_DIMS);
    if (!PyBuffer_IsContiguous(&a->view, 'C'))
      return uattn_py_fail_arg(a,
                               "must be C-contiguous (a strided view is not accepted: the library reads dense "
                               "arrays; pass numpy.ascontiguousarray(...) or a copy)");
    a->data = a->view.buf;
    a->ndim = a->view.ndim;
    for (int i = 0; i < a->ndim; i++) a->shape[i] = a->view.shape[i];
    a->kind = kind_of_format(a->view.format, a->view.itemsize);
    a->readonly = a->view.readonly;
  } else if (PyObject_HasAttrString(obj, "__dlpack__")) {
    PyObject *cap = PyObject_CallMethod(obj, "__dlpack__", NULL);
    if (!cap) {
      PyObject *et, *ev, *tb;
      PyErr_Fetch(&et, &ev, &tb);
      PyObject *s = ev ? PyObject_Str(ev) : NULL;
      uattn_py_fail_arg(a, "__dlpack__() failed: %s", s ? PyUnicode_AsUTF8(s) : "?");
      Py_XDECREF(s);
      Py_XDECREF(et);
      Py_XDECREF(ev);
      Py_XDECREF(tb);
      return -1;
    }
    dl_managed_tensor *m = PyCapsule_IsValid(cap, "dltensor") ? PyCapsule_GetPointer(cap, "dltensor") : NULL;
    if (!m) {
      Py_DECREF(cap);
      PyErr_Clear();
      return uattn_py_fail_arg(a, "__dlpack__() did not return an unused DLPack capsule");
    }
    /* the consumer's half of the protocol: rename, and call the deleter when done (uattn_py_array_release) */
    PyCapsule_SetName(cap, "used_dltensor");
    Py_DECREF(cap);
    a->dl = m;
    a->from_dlpack = 1;
    const dl_tensor *t = &m->dl_tensor;
    if (t->device.device_type != DL_CPU)
      return uattn_py_fail_arg(a, "must be in CPU memory (DLPack device %d)", (int)t->device.device_type);
    if (t->ndim > MAX_DIMS || t->ndim < 0) return uattn_py_fail_arg(a, "more than %d dimensions", MAX_DIMS);
    a->ndim = t->ndim;
    for (int i = 0; i < a->ndim; i++) a->shape[i] = (Py_ssize_t)t->shape[i];
    if (t->strides) {
      int64_t expect = 1;
      for (int i = a->ndim - 1; i >= 0; i--) {
        /* a dimension of one element may carry any stride (PyTorch's convention) */
        if (t->shape[i] != 1 && t->strides[i] != expect)
          return uattn_py_fail_arg(a,
                                   "must be C-contiguous (a strided view is not accepted: the library reads dense "
                                   "arrays; pass .contiguous() or a copy)");
        expect *= t->shape[i];
      }
    }
    a->data = (char *)t->data + t->byte_offset;
    a->kind = kind_of_dl(t->dtype);
    a->readonly = 0; /* DLPack (before 1.0) has no read-only flag */
  } else {
    PyErr_Format(PyExc_ValueError, "%s: expected an array (buffer protocol or __dlpack__), got %s", name,
                 Py_TYPE(obj)->tp_name);
    return -1;
  }
  if (writable && a->readonly) return uattn_py_fail_arg(a, "must be writable (got a read-only array)");
  return 0;
}

static void format_shape(char *buf, size_t cap, int ndim, const Py_ssize_t *shape) {
  size_t n = (size_t)snprintf(buf, cap, "(");
  for (int i = 0; i < ndim && n < cap; i++) /* a negative extent is a wildcard: "*" */
    n += shape[i] < 0 ? (size_t)snprintf(buf + n, cap - n, "%s*", i ? ", " : "")
                      : (size_t)snprintf(buf + n, cap - n, "%s%zd", i ? ", " : "", shape[i]);
  if (n < cap) snprintf(buf + n, cap - n, ndim == 1 ? ",)" : ")");
}

/* Checks the shape: want[i] < 0 accepts any extent. */
int uattn_py_array_shape(array *a, int ndim, const Py_ssize_t *want) {
  int ok = a->ndim == ndim;
  for (int i = 0; ok && i < ndim; i++) ok = want[i] < 0 || want[i] == a->shape[i];
  if (ok) return 0;
  char w[160], g[160];
  format_shape(w, sizeof w, ndim, want);
  format_shape(g, sizeof g, a->ndim, a->shape);
  return uattn_py_fail_arg(a, "expected shape %s, got %s", w, g);
}

int uattn_py_array_kind(array *a, enum kind k1, enum kind k2, const char *want) {
  if (a->kind == k1 || (k2 != K_OTHER && a->kind == k2)) return 0;
  return uattn_py_fail_arg(a, "expected %s, got %s", want, kind_name[a->kind]);
}

/* uattn_py_array_get, then uattn_py_array_kind and uattn_py_array_shape: an array argument of a known kind and shape. */
int uattn_py_array_checked(array *a, PyObject *obj, const char *name, int writable, enum kind k1, enum kind k2,
                           const char *want, int ndim, const Py_ssize_t *shape) {
  return uattn_py_array_get(a, obj, name, writable) || uattn_py_array_kind(a, k1, k2, want) ||
         uattn_py_array_shape(a, ndim, shape);
}

/* A float32 array argument of the given shape. */
int uattn_py_array_f32(array *a, PyObject *obj, const char *name, int writable, int ndim, const Py_ssize_t *shape) {
  return uattn_py_array_checked(a, obj, name, writable, K_F32, K_OTHER, "float32", ndim, shape);
}

/* An index argument: an int32 array, or a list/tuple of ints converted to one. */
int uattn_py_array_index(array *a, PyObject *obj, const char *name, int ndim) {
  if (PyList_Check(obj) || PyTuple_Check(obj)) {
    PyObject *conv = PyObject_CallMethod(uattn_py_numpy, "ascontiguousarray", "Os", obj, "int32");
    if (!conv) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "%s: expected int32 values, got a sequence numpy cannot convert", name);
      return -1;
    }
    int rc = uattn_py_array_get(a, conv, name, 0);
    a->owned = conv;
    if (rc) return -1;
  } else if (uattn_py_array_get(a, obj, name, 0)) {
    return -1;
  }
  if (a->ndim != ndim) {
    char g[160];
    format_shape(g, sizeof g, a->ndim, a->shape);
    return uattn_py_fail_arg(a, "expected a %d-dimensional int32 array, got shape %s", ndim, g);
  }
  return uattn_py_array_kind(a, K_I32, K_OTHER, "int32");
}

/* numpy.empty(shape, dtype); *data receives its memory. */
PyObject *uattn_py_new_numpy(int ndim, const Py_ssize_t *shape, PyObject *dtype, void **data) {
  PyObject *shp = PyTuple_New(ndim);
  if (!shp) return NULL;
  for (int i = 0; i < ndim; i++) PyTuple_SET_ITEM(shp, i, PyLong_FromSsize_t(shape[i]));
  PyObject *arr = PyObject_CallFunctionObjArgs(uattn_py_numpy_empty, shp, dtype, NULL);
  Py_DECREF(shp);
  if (!arr) return NULL;
  Py_buffer v;
  if (PyObject_GetBuffer(arr, &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) != 0) {
    Py_DECREF(arr);
    return NULL;
  }
  *data = v.buf; /* stays valid while arr lives: arr owns it and is never resized */
  PyBuffer_Release(&v);
  return arr;
}

PyObject *uattn_py_new_numpy_str(int ndim, const Py_ssize_t *shape, const char *dtype, void **data) {
  PyObject *d = PyUnicode_FromString(dtype);
  if (!d) return NULL;
  PyObject *arr = uattn_py_new_numpy(ndim, shape, d, data);
  Py_DECREF(d);
  return arr;
}

/* A 1-D NumPy copy of n elements at src. */
PyObject *uattn_py_numpy_copy(const void *src, Py_ssize_t n, size_t elem, const char *dtype) {
  void *dst;
  PyObject *arr = uattn_py_new_numpy_str(1, &n, dtype, &dst);
  if (arr && n > 0) memcpy(dst, src, (size_t)n * elem);
  return arr;
}

int uattn_py_set_item(PyObject *d, const char *key, PyObject *v) {
  if (!v) return -1;
  int rc = PyDict_SetItemString(d, key, v);
  Py_DECREF(v);
  return rc;
}

/* ---- names of enums ----------------------------------------------------------------------------- */

int uattn_py_parse_dtype(PyObject *obj, const char *arg, uattn_dtype *out) {
  const char *s = PyUnicode_Check(obj) ? PyUnicode_AsUTF8(obj) : NULL;
  if (s && (!strcmp(s, "f32") || !strcmp(s, "float32")))
    *out = UATTN_F32;
  else if (s && (!strcmp(s, "bf16") || !strcmp(s, "bfloat16")))
    *out = UATTN_BF16;
  else if (s && (!strcmp(s, "f16") || !strcmp(s, "float16")))
    *out = UATTN_F16;
  else if (s && (!strcmp(s, "fp8_e4m3") || !strcmp(s, "float8_e4m3fn")))
    *out = UATTN_FP8_E4M3;
  else if (s && (!strcmp(s, "fp8_e5m2") || !strcmp(s, "float8_e5m2")))
    *out = UATTN_FP8_E5M2;
  else {
    PyErr_Format(PyExc_ValueError,
                 "%s: expected \"f32\", \"bf16\", \"f16\", \"fp8_e4m3\" or \"fp8_e5m2\" (fp8: cache_dtype only), "
                 "got %R",
                 arg, obj);
    return -1;
  }
  return 0;
}

const char *uattn_py_dtype_str(uattn_dtype d) {
  switch (d) {
  case UATTN_F32: return "f32";
  case UATTN_BF16: return "bf16";
  case UATTN_F16: return "f16";
  case UATTN_FP8_E4M3: return "fp8_e4m3";
  case UATTN_FP8_E5M2: return "fp8_e5m2";
  }
  return "?";
}
