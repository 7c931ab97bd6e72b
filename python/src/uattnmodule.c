/*
 * uattn for Python: a CPython extension module over the C library (include/uattn.h).
 *
 * Tensors are taken without copies from any object with the buffer protocol (NumPy) or __dlpack__
 * (PyTorch): the library reads and writes the caller's memory, and the caches are updated in place. Every
 * array is checked (kind, shape, C-contiguity, writability) before the library is called, so a bad one
 * raises ValueError naming the argument and nothing is written. The library's own refusals become
 * uattn.Error subclasses carrying its message. The GIL is released around the planner and the forward,
 * the calls that take time, so an engine's other Python threads run meanwhile.
 *
 * Only the CPython C API is used (no NumPy C API): the module builds against python3-dev alone and
 * creates its output arrays by calling numpy.empty.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "uattn.h"
#include "uattn_vllm.h"

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

/* ---- module state ------------------------------------------------------------------------------- */

static PyObject *numpy_mod;                               /* numpy */
static PyObject *numpy_empty;                             /* numpy.empty */
static PyObject *simple_namespace;                        /* types.SimpleNamespace, the class of Plan.step's result */
static PyObject *span_dtype;                              /* numpy dtype of uattn_shared_span */
static PyObject *unique_dtype;                            /* numpy dtype of uattn_unique_block */
static PyObject *uattn_error;                             /* uattn.Error */
static PyObject *status_error[UATTN_ERR_UNSUPPORTED + 1]; /* uattn.<Status>Error per status */

/* Raises the exception of a library status with the library's message (read at once: it is this
 * thread's and the next library call replaces it). */
static PyObject *raise_status(uattn_status st) {
  PyObject *cls = (st > 0 && st <= UATTN_ERR_UNSUPPORTED && status_error[st]) ? status_error[st] : uattn_error;
  const char *msg = uattn_last_error();
  PyErr_Format(cls, "%s: %s", uattn_status_name(st), (msg && msg[0]) ? msg : "(no message)");
  return NULL;
}

/* ---- arrays --------------------------------------------------------------------------------------- */

enum kind { K_OTHER = 0, K_F32, K_F16, K_BF16, K_U16, K_F64, K_I32, K_I64, K_BOOL, K_U8 };
static const char *kind_name[] = {"another dtype", "float32", "float16", "bfloat16", "uint16",
                                  "float64",       "int32",   "int64",   "bool",     "uint8"};

#define MAX_DIMS 8

typedef struct {
  const char *name; /* the argument, for messages */
  void *data;
  int ndim;
  Py_ssize_t shape[MAX_DIMS];
  enum kind kind;
  int readonly;
  int from_dlpack;
  int has_view;
  Py_buffer view;
  dl_managed_tensor *dl;
  PyObject *owned; /* an array converted from a list, kept alive while used */
} array;

static void array_release(array *a) {
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

static int fail_arg(const array *a, const char *fmt, ...) {
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
static int array_get(array *a, PyObject *obj, const char *name, int writable) {
  memset(a, 0, sizeof *a);
  a->name = name;
  if (PyObject_CheckBuffer(obj)) {
    if (PyObject_GetBuffer(obj, &a->view, PyBUF_STRIDES | PyBUF_FORMAT) != 0) {
      PyErr_Clear();
      return fail_arg(a, "its buffer cannot be read as a strided array");
    }
    a->has_view = 1;
    if (a->view.ndim > MAX_DIMS) return fail_arg(a, "more than %d dimensions", MAX_DIMS);
    if (!PyBuffer_IsContiguous(&a->view, 'C'))
      return fail_arg(a,
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
      fail_arg(a, "__dlpack__() failed: %s", s ? PyUnicode_AsUTF8(s) : "?");
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
      return fail_arg(a, "__dlpack__() did not return an unused DLPack capsule");
    }
    /* the consumer's half of the protocol: rename, and call the deleter when done (array_release) */
    PyCapsule_SetName(cap, "used_dltensor");
    Py_DECREF(cap);
    a->dl = m;
    a->from_dlpack = 1;
    const dl_tensor *t = &m->dl_tensor;
    if (t->device.device_type != DL_CPU)
      return fail_arg(a, "must be in CPU memory (DLPack device %d)", (int)t->device.device_type);
    if (t->ndim > MAX_DIMS || t->ndim < 0) return fail_arg(a, "more than %d dimensions", MAX_DIMS);
    a->ndim = t->ndim;
    for (int i = 0; i < a->ndim; i++) a->shape[i] = (Py_ssize_t)t->shape[i];
    if (t->strides) {
      int64_t expect = 1;
      for (int i = a->ndim - 1; i >= 0; i--) {
        /* a dimension of one element may carry any stride (PyTorch's convention) */
        if (t->shape[i] != 1 && t->strides[i] != expect)
          return fail_arg(a,
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
  if (writable && a->readonly) return fail_arg(a, "must be writable (got a read-only array)");
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
static int array_shape(array *a, int ndim, const Py_ssize_t *want) {
  int ok = a->ndim == ndim;
  for (int i = 0; ok && i < ndim; i++) ok = want[i] < 0 || want[i] == a->shape[i];
  if (ok) return 0;
  char w[160], g[160];
  format_shape(w, sizeof w, ndim, want);
  format_shape(g, sizeof g, a->ndim, a->shape);
  return fail_arg(a, "expected shape %s, got %s", w, g);
}

static int array_kind(array *a, enum kind k1, enum kind k2, const char *want) {
  if (a->kind == k1 || (k2 != K_OTHER && a->kind == k2)) return 0;
  return fail_arg(a, "expected %s, got %s", want, kind_name[a->kind]);
}

/* array_get, then array_kind and array_shape: an array argument of a known kind and shape. */
static int array_checked(array *a, PyObject *obj, const char *name, int writable, enum kind k1, enum kind k2,
                         const char *want, int ndim, const Py_ssize_t *shape) {
  return array_get(a, obj, name, writable) || array_kind(a, k1, k2, want) || array_shape(a, ndim, shape);
}

/* A float32 array argument of the given shape. */
static int array_f32(array *a, PyObject *obj, const char *name, int writable, int ndim, const Py_ssize_t *shape) {
  return array_checked(a, obj, name, writable, K_F32, K_OTHER, "float32", ndim, shape);
}

/* An index argument: an int32 array, or a list/tuple of ints converted to one. */
static int array_index(array *a, PyObject *obj, const char *name, int ndim) {
  if (PyList_Check(obj) || PyTuple_Check(obj)) {
    PyObject *conv = PyObject_CallMethod(numpy_mod, "ascontiguousarray", "Os", obj, "int32");
    if (!conv) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "%s: expected int32 values, got a sequence numpy cannot convert", name);
      return -1;
    }
    int rc = array_get(a, conv, name, 0);
    a->owned = conv;
    if (rc) return -1;
  } else if (array_get(a, obj, name, 0)) {
    return -1;
  }
  if (a->ndim != ndim) {
    char g[160];
    format_shape(g, sizeof g, a->ndim, a->shape);
    return fail_arg(a, "expected a %d-dimensional int32 array, got shape %s", ndim, g);
  }
  return array_kind(a, K_I32, K_OTHER, "int32");
}

/* numpy.empty(shape, dtype); *data receives its memory. */
static PyObject *new_numpy(int ndim, const Py_ssize_t *shape, PyObject *dtype, void **data) {
  PyObject *shp = PyTuple_New(ndim);
  if (!shp) return NULL;
  for (int i = 0; i < ndim; i++) PyTuple_SET_ITEM(shp, i, PyLong_FromSsize_t(shape[i]));
  PyObject *arr = PyObject_CallFunctionObjArgs(numpy_empty, shp, dtype, NULL);
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

static PyObject *new_numpy_str(int ndim, const Py_ssize_t *shape, const char *dtype, void **data) {
  PyObject *d = PyUnicode_FromString(dtype);
  if (!d) return NULL;
  PyObject *arr = new_numpy(ndim, shape, d, data);
  Py_DECREF(d);
  return arr;
}

/* A 1-D NumPy copy of n elements at src. */
static PyObject *numpy_copy(const void *src, Py_ssize_t n, size_t elem, const char *dtype) {
  void *dst;
  PyObject *arr = new_numpy_str(1, &n, dtype, &dst);
  if (arr && n > 0) memcpy(dst, src, (size_t)n * elem);
  return arr;
}

/* ---- names of enums ----------------------------------------------------------------------------- */

static int parse_dtype(PyObject *obj, const char *arg, uattn_dtype *out) {
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

static const char *dtype_str(uattn_dtype d) {
  switch (d) {
  case UATTN_F32: return "f32";
  case UATTN_BF16: return "bf16";
  case UATTN_F16: return "f16";
  case UATTN_FP8_E4M3: return "fp8_e4m3";
  case UATTN_FP8_E5M2: return "fp8_e5m2";
  }
  return "?";
}

static bool is_fp8(uattn_dtype d) { return d == UATTN_FP8_E4M3 || d == UATTN_FP8_E5M2; }

static const char *attn_type_names[] = {"decoder", "encoder", "encoder_only", "encoder_decoder"};
static const char *layout_names[] = {"NHD", "HND", "TILED"}; /* by uattn_kv_layout */

/* ---- errors --------------------------------------------------------------------------------------- */

static int add_errors(PyObject *m) {
  uattn_error = PyErr_NewExceptionWithDoc(
      "uattn.Error",
      "A call the library refused. .status is the status name (\"UATTN_ERR_OUT_OF_RANGE\"); the message is "
      "the library's. Nothing the call was given to write has changed.",
      NULL, NULL);
  if (!uattn_error || PyObject_SetAttrString(uattn_error, "status", Py_None) ||
      PyModule_AddObjectRef(m, "Error", uattn_error))
    return -1;
  /* each status also derives from the builtin exception an engine would catch for it */
  static const struct {
    uattn_status st;
    const char *name;
    PyObject **builtin;
  } map[] = {
      {UATTN_ERR_INVALID_ARGUMENT, "InvalidArgumentError", &PyExc_ValueError},
      {UATTN_ERR_OUT_OF_RANGE, "OutOfRangeError", &PyExc_IndexError},
      {UATTN_ERR_INCONSISTENT, "InconsistentError", &PyExc_ValueError},
      {UATTN_ERR_CAPACITY, "CapacityError", NULL},
      {UATTN_ERR_OVERFLOW, "OverflowError", &PyExc_OverflowError},
      {UATTN_ERR_TOO_LARGE, "TooLargeError", NULL},
      {UATTN_ERR_NO_MEMORY, "NoMemoryError", &PyExc_MemoryError},
      {UATTN_ERR_UNSUPPORTED, "UnsupportedError", &PyExc_NotImplementedError},
  };
  for (size_t i = 0; i < sizeof map / sizeof map[0]; i++) {
    char qual[64];
    snprintf(qual, sizeof qual, "uattn.%s", map[i].name);
    PyObject *bases = map[i].builtin ? PyTuple_Pack(2, uattn_error, *map[i].builtin) : PyTuple_Pack(1, uattn_error);
    if (!bases) return -1;
    PyObject *cls = PyErr_NewException(qual, bases, NULL);
    Py_DECREF(bases);
    if (!cls) return -1;
    PyObject *st = PyUnicode_FromString(uattn_status_name(map[i].st));
    int rc = st ? PyObject_SetAttrString(cls, "status", st) : -1;
    Py_XDECREF(st);
    if (rc || PyModule_AddObjectRef(m, map[i].name, cls)) {
      Py_DECREF(cls);
      return -1;
    }
    status_error[map[i].st] = cls; /* the module keeps the other reference */
  }
  return 0;
}

/* ---- Runtime ---------------------------------------------------------------------------------------- */

typedef struct {
  PyObject_HEAD uattn_runtime *rt;
  int in_use; /* forward calls running on it (counted under the GIL) */
} RuntimeObject;

static PyTypeObject Runtime_Type;

static int Runtime_init(RuntimeObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"num_threads", "cpuset", "pin", "pin_caller", "spin_us", NULL};
  int num_threads = 0, pin = 1, pin_caller = 0, spin_us = -1;
  const char *cpuset = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "|iziip:Runtime", kwlist, &num_threads, &cpuset, &pin, &pin_caller,
                                   &spin_us))
    return -1;
  if (self->rt) {
    PyErr_SetString(PyExc_RuntimeError, "Runtime already initialized");
    return -1;
  }
  uattn_runtime_config cfg = uattn_runtime_config_default();
  cfg.num_threads = num_threads;
  cfg.cpuset = cpuset;
  cfg.pin = pin;
  cfg.pin_caller = pin_caller;
  if (spin_us >= 0) cfg.spin_us = spin_us;
  uattn_status st;
  uattn_runtime *rt = NULL;
  Py_BEGIN_ALLOW_THREADS st = uattn_runtime_create(&cfg, &rt);
  Py_END_ALLOW_THREADS if (st != UATTN_OK) {
    raise_status(st);
    return -1;
  }
  self->rt = rt;
  return 0;
}

static void Runtime_dealloc(RuntimeObject *self) {
  uattn_runtime_destroy(self->rt);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Runtime_close(RuntimeObject *self, PyObject *unused) {
  if (self->in_use) {
    PyErr_SetString(PyExc_RuntimeError, "Runtime.close(): a forward call is running on this runtime");
    return NULL;
  }
  uattn_runtime *rt = self->rt;
  self->rt = NULL;
  Py_BEGIN_ALLOW_THREADS uattn_runtime_destroy(rt);
  Py_END_ALLOW_THREADS Py_RETURN_NONE;
}

static PyObject *Runtime_enter(PyObject *self, PyObject *unused) { return Py_NewRef(self); }
static PyObject *Runtime_exit(RuntimeObject *self, PyObject *args) { return Runtime_close(self, NULL); }

static PyObject *counts_dict(const uattn_topology_counts *c) {
  return Py_BuildValue("{s:i,s:i,s:i,s:i}", "packages", c->packages, "numa_nodes", c->numa_nodes, "cores", c->cores,
                       "pus", c->pus);
}

static PyObject *Runtime_topology(RuntimeObject *self, void *closure) {
  if (!self->rt) {
    PyErr_SetString(PyExc_RuntimeError, "the runtime is closed");
    return NULL;
  }
  uattn_topology t;
  uattn_status st = uattn_runtime_get_topology(self->rt, &t);
  if (st != UATTN_OK) return raise_status(st);
  int n = t.num_workers < UATTN_TOPOLOGY_MAX_WORKERS ? t.num_workers : UATTN_TOPOLOGY_MAX_WORKERS;
  PyObject *pus = PyList_New(n), *numa = PyList_New(n);
  if (!pus || !numa) {
    Py_XDECREF(pus);
    Py_XDECREF(numa);
    return NULL;
  }
  for (int i = 0; i < n; i++) {
    PyList_SET_ITEM(pus, i, PyLong_FromLong(t.worker_pu[i]));
    PyList_SET_ITEM(numa, i, PyLong_FromLong(t.worker_numa[i]));
  }
  return Py_BuildValue("{s:N,s:N,s:N,s:n,s:n,s:n,s:i,s:i,s:O,s:O,s:i,s:N,s:N}", "machine", counts_dict(&t.machine),
                       "binding", counts_dict(&t.binding), "usable", counts_dict(&t.usable), "l1d_bytes",
                       (Py_ssize_t)t.l1d_bytes, "l2_bytes", (Py_ssize_t)t.l2_bytes, "l3_bytes", (Py_ssize_t)t.l3_bytes,
                       "l3_cores", t.l3_cores, "num_workers", t.num_workers, "pinned", t.pinned ? Py_True : Py_False,
                       "oversubscribed", t.oversubscribed ? Py_True : Py_False, "caller_pu", t.caller_pu, "worker_pu",
                       pus, "worker_numa", numa);
}

static PyObject *Runtime_num_workers(RuntimeObject *self, void *closure) {
  PyObject *t = Runtime_topology(self, NULL);
  if (!t) return NULL;
  PyObject *n = PyDict_GetItemString(t, "num_workers");
  Py_XINCREF(n);
  Py_DECREF(t);
  return n;
}

static PyMethodDef Runtime_methods[] = {
    {"close", (PyCFunction)Runtime_close, METH_NOARGS, "Stops the workers now (otherwise when collected)."},
    {"__enter__", (PyCFunction)Runtime_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)Runtime_exit, METH_VARARGS, NULL},
    {NULL}};

static PyGetSetDef Runtime_getset[] = {
    {"topology", (getter)Runtime_topology, NULL,
     "What hwloc found (machine, binding, usable counts, cache sizes) and where each worker runs.", NULL},
    {"num_workers", (getter)Runtime_num_workers, NULL, "Workers, the calling thread included.", NULL},
    {NULL}};

static PyTypeObject Runtime_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "uattn.Runtime",
    .tp_basicsize = sizeof(RuntimeObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "Runtime(num_threads=0, cpuset=None, pin=True, pin_caller=False, spin_us=50)\n\n"
        "Worker threads pinned to cores (hwloc), created once per engine; pass it to forward().",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Runtime_init,
    .tp_dealloc = (destructor)Runtime_dealloc,
    .tp_methods = Runtime_methods,
    .tp_getset = Runtime_getset,
};

/* ---- Layer ---------------------------------------------------------------------------------------- */

typedef struct {
  PyObject_HEAD uattn_layer layer;
  float *sinks; /* owned copies: a layer outlives the arrays it was built from */
  float *alibi;
} LayerObject;

static PyTypeObject Layer_Type;

/* Copies a [n] float32/float64 array (or a sequence of numbers) into fresh memory. */
static int copy_head_values(PyObject *obj, const char *name, int32_t n, float **out) {
  if (obj == Py_None) return 0;
  PyObject *conv = PyObject_CallMethod(numpy_mod, "ascontiguousarray", "Os", obj, "float32");
  if (!conv) {
    PyErr_Clear();
    PyErr_Format(PyExc_ValueError, "%s: expected %d numbers (one per query head)", name, (int)n);
    return -1;
  }
  array a;
  int rc = array_get(&a, conv, name, 0);
  Py_ssize_t want = n;
  if (!rc) rc = array_shape(&a, 1, &want);
  if (!rc) {
    *out = PyMem_Malloc((size_t)n * sizeof(float));
    if (!*out) {
      PyErr_NoMemory();
      rc = -1;
    } else {
      memcpy(*out, a.data, (size_t)n * sizeof(float));
    }
  }
  array_release(&a);
  Py_DECREF(conv);
  return rc;
}

static int Layer_init(LayerObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"num_q_heads",  "num_kv_heads", "head_dim",       "dtype",   "cache_dtype",  "kv_layout",
                           "scale",        "soft_cap",     "sliding_window", "sinks",   "alibi_slopes", "attn_type",
                           "causal_width", "chunk_size",   "probs_fp32",     "k_scale", "v_scale",      NULL};
  int hq, hkv, d, window = 0, causal_width = 0, chunk = 0, probs_fp32 = 0;
  double k_scale = 1.0, v_scale = 1.0;
  PyObject *dtype_o = NULL, *cache_o = Py_None, *scale_o = Py_None, *sinks_o = Py_None, *alibi_o = Py_None;
  const char *layout = "NHD", *attn = "decoder";
  double soft_cap = 0.0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "iii|OOsOdiOOsiipdd:Layer", kwlist, &hq, &hkv, &d, &dtype_o, &cache_o,
                                   &layout, &scale_o, &soft_cap, &window, &sinks_o, &alibi_o, &attn, &causal_width,
                                   &chunk, &probs_fp32, &k_scale, &v_scale))
    return -1;
  /* immutable once made: a forward on another thread may be reading it with the GIL released */
  if (self->layer.num_q_heads) {
    PyErr_SetString(PyExc_RuntimeError, "Layer already initialized (layers are immutable)");
    return -1;
  }
  if (hq <= 0 || hkv <= 0 || d <= 0 || hq % hkv) {
    PyErr_Format(PyExc_ValueError,
                 "num_q_heads, num_kv_heads, head_dim: expected positive counts with num_q_heads a multiple of "
                 "num_kv_heads, got %d, %d, %d",
                 hq, hkv, d);
    return -1;
  }
  uattn_dtype dtype = UATTN_BF16, cache_dtype;
  if (dtype_o && parse_dtype(dtype_o, "dtype", &dtype)) return -1;
  cache_dtype = dtype;
  if (cache_o != Py_None && parse_dtype(cache_o, "cache_dtype", &cache_dtype)) return -1;
  if (is_fp8(dtype)) {
    PyErr_Format(PyExc_ValueError, "dtype: \"%s\" is a cache dtype only (q, k, v and out are f32, bf16 or f16)",
                 dtype_str(dtype));
    return -1;
  }
  /* checked whatever the cache dtype (the library ignores them for other caches): a bad scale is a mistake
   * either way, and a float that rounds to 0 or inf would store infinities */
  const float ks = (float)k_scale, vs = (float)v_scale;
  if (!(isfinite(ks) && ks > 0) || !(isfinite(vs) && vs > 0)) {
    char msg[160];
    snprintf(msg, sizeof msg, "k_scale, v_scale: expected finite numbers > 0 (as float32), got %g, %g", k_scale,
             v_scale);
    PyErr_SetString(PyExc_ValueError, msg);
    return -1;
  }
  uattn_layer L = uattn_layer_default(hq, hkv, d, dtype);
  L.cache_dtype = cache_dtype;
  L.k_scale = ks;
  L.v_scale = vs;
  int l = 0;
  while (l < 3 && strcmp(layout, layout_names[l])) l++;
  if (l == 3) {
    PyErr_Format(PyExc_ValueError, "kv_layout: expected \"NHD\", \"HND\" or \"TILED\", got \"%s\"", layout);
    return -1;
  }
  L.kv_layout = (uattn_kv_layout)l;
  int t = -1;
  for (int i = 0; i < 4; i++)
    if (!strcmp(attn, attn_type_names[i])) t = i;
  if (t < 0) {
    PyErr_Format(PyExc_ValueError,
                 "attn_type: expected \"decoder\", \"encoder\", \"encoder_only\" or \"encoder_decoder\", got \"%s\"",
                 attn);
    return -1;
  }
  L.attn_type = (uattn_attention_type)t;
  if (scale_o != Py_None) {
    double s = PyFloat_AsDouble(scale_o);
    if (s == -1.0 && PyErr_Occurred()) return -1;
    L.scale = (float)s;
  }
  if (soft_cap < 0 || window < 0 || causal_width < 0 || chunk < 0) {
    PyErr_SetString(PyExc_ValueError, "soft_cap, sliding_window, causal_width, chunk_size: expected >= 0");
    return -1;
  }
  L.soft_cap = (float)soft_cap;
  L.sliding_window = window;
  L.causal_width = causal_width;
  L.chunk_size = chunk;
  L.probs_fp32 = probs_fp32 != 0;
  if (copy_head_values(sinks_o, "sinks", hq, &self->sinks) ||
      copy_head_values(alibi_o, "alibi_slopes", hq, &self->alibi)) {
    PyMem_Free(self->sinks); /* a failed __init__ leaves the object as new */
    PyMem_Free(self->alibi);
    self->sinks = self->alibi = NULL;
    return -1;
  }
  L.sinks = self->sinks;
  L.alibi_slopes = self->alibi;
  self->layer = L;
  return 0;
}

static void Layer_dealloc(LayerObject *self) {
  PyMem_Free(self->sinks);
  PyMem_Free(self->alibi);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Layer_get(LayerObject *self, void *which) {
  const uattn_layer *L = &self->layer;
  switch ((intptr_t)which) {
  case 0: return PyLong_FromLong(L->num_q_heads);
  case 1: return PyLong_FromLong(L->num_kv_heads);
  case 2: return PyLong_FromLong(L->head_dim);
  case 3: return PyUnicode_FromString(dtype_str(L->dtype));
  case 4: return PyUnicode_FromString(dtype_str(L->cache_dtype));
  case 5: return PyUnicode_FromString(layout_names[L->kv_layout]);
  case 6: return PyFloat_FromDouble(L->scale);
  case 7: return PyFloat_FromDouble(L->soft_cap);
  case 8: return PyLong_FromLong(L->sliding_window);
  case 9: return self->sinks ? numpy_copy(self->sinks, L->num_q_heads, 4, "float32") : Py_NewRef(Py_None);
  case 10: return self->alibi ? numpy_copy(self->alibi, L->num_q_heads, 4, "float32") : Py_NewRef(Py_None);
  case 11: return PyUnicode_FromString(attn_type_names[L->attn_type]);
  case 12: return PyLong_FromLong(L->causal_width);
  case 13: return PyLong_FromLong(L->chunk_size);
  case 15: return PyFloat_FromDouble(L->k_scale);
  case 16: return PyFloat_FromDouble(L->v_scale);
  default: return PyBool_FromLong(L->probs_fp32);
  }
}

#define LAYER_ATTR(name, i)                                                                                            \
  { name, (getter)Layer_get, NULL, NULL, (void *)(intptr_t)(i) }
static PyGetSetDef Layer_getset[] = {
    LAYER_ATTR("num_q_heads", 0),   LAYER_ATTR("num_kv_heads", 1),  LAYER_ATTR("head_dim", 2),
    LAYER_ATTR("dtype", 3),         LAYER_ATTR("cache_dtype", 4),   LAYER_ATTR("kv_layout", 5),
    LAYER_ATTR("scale", 6),         LAYER_ATTR("soft_cap", 7),      LAYER_ATTR("sliding_window", 8),
    LAYER_ATTR("sinks", 9),         LAYER_ATTR("alibi_slopes", 10), LAYER_ATTR("attn_type", 11),
    LAYER_ATTR("causal_width", 12), LAYER_ATTR("chunk_size", 13),   LAYER_ATTR("probs_fp32", 14),
    LAYER_ATTR("k_scale", 15),      LAYER_ATTR("v_scale", 16),      {NULL}};

static PyObject *Layer_repr(LayerObject *self) {
  const uattn_layer *L = &self->layer;
  return PyUnicode_FromFormat(
      "uattn.Layer(%d, %d, %d, dtype=\"%s\", cache_dtype=\"%s\", kv_layout=\"%s\", "
      "attn_type=\"%s\")",
      L->num_q_heads, L->num_kv_heads, L->head_dim, dtype_str(L->dtype), dtype_str(L->cache_dtype),
      layout_names[L->kv_layout], attn_type_names[L->attn_type]);
}

static PyTypeObject Layer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "uattn.Layer",
    .tp_basicsize = sizeof(LayerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "Layer(num_q_heads, num_kv_heads, head_dim, dtype=\"bf16\", cache_dtype=None, kv_layout=\"NHD\",\n"
        "      scale=None, soft_cap=0.0, sliding_window=0, sinks=None, alibi_slopes=None,\n"
        "      attn_type=\"decoder\", causal_width=0, chunk_size=0, probs_fp32=False, k_scale=1.0,\n"
        "      v_scale=1.0)\n\n"
        "One attention layer (uattn_layer); immutable. kv_layout: \"NHD\", \"HND\" or \"TILED\" (the cache "
        "shapes: forward's doc). scale None: 1/sqrt(head_dim); cache_dtype None: dtype; \"fp8_e4m3\" "
        "(\"float8_e4m3fn\") and \"fp8_e5m2\" (\"float8_e5m2\") are cache dtypes only, "
        "their caches uint8 arrays of the codes: the cache holds fp8(k / k_scale) and fp8(v / v_scale) and is "
        "read as fp8 * scale (k_scale, v_scale: finite, > 0). sinks and alibi_slopes ([num_q_heads]) are "
        "copied. probs_fp32: keep P in fp32 where the kernels would round it to bf16 (bf16 dot-product CPUs).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Layer_init,
    .tp_dealloc = (destructor)Layer_dealloc,
    .tp_getset = Layer_getset,
    .tp_repr = (reprfunc)Layer_repr,
};

/* ---- Plan ----------------------------------------------------------------------------------------- */

typedef struct {
  PyObject_HEAD uattn_plan *plan;
  uattn_plan_config cfg;
  /* A plan is used by one thread at a time (uattn.h). The GIL is released during step and forward, so two
   * Python threads sharing a plan would otherwise overlap: this lock serializes them. It is only taken
   * with the GIL released, so a thread waiting for it never blocks the GIL's holder. */
  PyThread_type_lock lock;
} PlanObject;

static PyTypeObject Plan_Type;

static void plan_acquire(PlanObject *p) {
  if (PyThread_acquire_lock(p->lock, NOWAIT_LOCK)) return;
  Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock(p->lock, WAIT_LOCK);
  Py_END_ALLOW_THREADS
}

static int Plan_init(PlanObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"block_size",    "num_blocks", "max_num_seqs",   "max_num_batched_tokens",
                           "max_model_len", "chunk_size", "split_min_keys", "split_keys",
                           "bucketing",     NULL};
  int bs, nb, seqs, tokens, model_len, chunk = 0, split_min = 0, split = 0;
  const char *bucketing = "none";
  if (!PyArg_ParseTupleAndKeywords(args, kw, "iiiii|iiis:Plan", kwlist, &bs, &nb, &seqs, &tokens, &model_len, &chunk,
                                   &split_min, &split, &bucketing))
    return -1;
  if (self->plan) {
    PyErr_SetString(PyExc_RuntimeError, "Plan already initialized");
    return -1;
  }
  uattn_plan_config cfg = uattn_plan_config_default(bs, nb, seqs, tokens, model_len);
  cfg.chunk_size = chunk;
  if (split_min) cfg.split_min_keys = split_min;
  if (split) cfg.split_keys = split;
  if (!strcmp(bucketing, "none"))
    cfg.bucketing.mode = UATTN_BUCKETING_NONE;
  else if (!strcmp(bucketing, "exponential"))
    cfg.bucketing.mode = UATTN_BUCKETING_EXPONENTIAL;
  else {
    PyErr_Format(PyExc_ValueError, "bucketing: expected \"none\" or \"exponential\", got \"%s\"", bucketing);
    return -1;
  }
  uattn_status st = uattn_plan_create(&cfg, &self->plan);
  if (st != UATTN_OK) {
    self->plan = NULL;
    raise_status(st);
    return -1;
  }
  self->cfg = cfg;
  self->lock = PyThread_allocate_lock();
  if (!self->lock) {
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

static void Plan_dealloc(PlanObject *self) {
  uattn_plan_destroy(self->plan);
  if (self->lock) PyThread_free_lock(self->lock);
  Py_TYPE(self)->tp_free((PyObject *)self);
}

static int plan_ready(PlanObject *p) {
  if (p->plan && p->lock) return 0;
  PyErr_SetString(PyExc_RuntimeError, "the Plan was not initialized");
  return -1;
}

/* Drafts as the Python caller writes them (one sequence of token ids per request, None or empty for a
 * request without drafts) into the C API's CSR form. */
static int drafts_to_csr(PyObject *obj, int32_t num_reqs, int32_t **tokens, int32_t **offsets) {
  PyObject *seq = PySequence_Fast(obj, "draft_tokens: expected one sequence of token ids per request");
  if (!seq) {
    PyErr_Clear();
    PyErr_SetString(PyExc_ValueError, "draft_tokens: expected one sequence of token ids (or None) per request");
    return -1;
  }
  if (PySequence_Fast_GET_SIZE(seq) != num_reqs) {
    PyErr_Format(PyExc_ValueError, "draft_tokens: expected %d entries (one per request), got %zd", (int)num_reqs,
                 PySequence_Fast_GET_SIZE(seq));
    Py_DECREF(seq);
    return -1;
  }
  Py_ssize_t total = 0;
  PyObject **items = PySequence_Fast_ITEMS(seq);
  int rc = -1;
  PyObject **rows = PyMem_Calloc((size_t)num_reqs + 1, sizeof(PyObject *));
  *offsets = PyMem_Malloc(((size_t)num_reqs + 1) * sizeof(int32_t));
  *tokens = NULL;
  if (!rows || !*offsets) {
    PyErr_NoMemory();
    goto done;
  }
  for (int32_t r = 0; r < num_reqs; r++) {
    if (items[r] == Py_None) continue;
    rows[r] = PySequence_Fast(items[r], "");
    if (!rows[r]) {
      PyErr_Clear();
      PyErr_Format(PyExc_ValueError, "draft_tokens[%d]: expected a sequence of token ids or None", (int)r);
      goto done;
    }
    total += PySequence_Fast_GET_SIZE(rows[r]);
  }
  if (total > INT32_MAX) {
    PyErr_SetString(PyExc_ValueError, "draft_tokens: more than 2^31-1 drafts");
    goto done;
  }
  *tokens = PyMem_Malloc(((size_t)total + 1) * sizeof(int32_t));
  if (!*tokens) {
    PyErr_NoMemory();
    goto done;
  }
  Py_ssize_t k = 0;
  for (int32_t r = 0; r < num_reqs; r++) {
    (*offsets)[r] = (int32_t)k;
    Py_ssize_t n = rows[r] ? PySequence_Fast_GET_SIZE(rows[r]) : 0;
    for (Py_ssize_t i = 0; i < n; i++) {
      long v = PyLong_AsLong(PySequence_Fast_ITEMS(rows[r])[i]);
      if ((v == -1 && PyErr_Occurred()) || v < INT32_MIN || v > INT32_MAX) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "draft_tokens[%d][%zd]: expected an int32 token id", (int)r, i);
        goto done;
      }
      (*tokens)[k++] = (int32_t)v;
    }
  }
  (*offsets)[num_reqs] = (int32_t)k;
  rc = 0;
done:
  if (rows)
    for (int32_t r = 0; r < num_reqs; r++) Py_XDECREF(rows[r]);
  PyMem_Free(rows);
  Py_DECREF(seq);
  if (rc) {
    PyMem_Free(*tokens);
    PyMem_Free(*offsets);
    *tokens = *offsets = NULL;
  }
  return rc;
}

static PyObject *bucket_tuple(const uattn_bucket *b) {
  return Py_BuildValue("{s:i,s:i,s:i,s:i}", "query_len", b->query_len, "shared_blocks", b->shared_blocks,
                       "unique_blocks", b->unique_blocks, "logits", b->logits);
}

static int set_item(PyObject *d, const char *key, PyObject *v) {
  if (!v) return -1;
  int rc = PyDict_SetItemString(d, key, v);
  Py_DECREF(v);
  return rc;
}

/* Copies the plan's info into a namespace of NumPy arrays: the plan's own buffers change at its next step. */
static PyObject *info_object(const uattn_plan_info *in) {
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  Py_ssize_t R = in->num_reqs, T = in->num_tokens, L = in->num_logits;
  int rc = 0;
  rc |= set_item(d, "block_size", PyLong_FromLong(in->block_size));
  rc |= set_item(d, "num_reqs", PyLong_FromSsize_t(R));
  rc |= set_item(d, "num_tokens", PyLong_FromSsize_t(T));
  rc |= set_item(d, "contains_prompts", PyBool_FromLong(in->contains_prompts));
  rc |= set_item(d, "num_scheduled", numpy_copy(in->num_scheduled, R, 4, "int32"));
  rc |= set_item(d, "query_start_loc", numpy_copy(in->query_start_loc, R + 1, 4, "int32"));
  rc |= set_item(d, "seq_lens", numpy_copy(in->seq_lens, R, 4, "int32"));
  rc |= set_item(d, "is_prompt", numpy_copy(in->is_prompt, R, sizeof(bool), "bool"));
  rc |= set_item(d, "num_output_tokens", numpy_copy(in->num_output_tokens, R, 4, "int32"));
  rc |= set_item(d, "token_groups", numpy_copy(in->token_groups, T, 4, "int32"));
  rc |= set_item(d, "token_offsets", numpy_copy(in->token_offsets, T, 4, "int32"));
  rc |= set_item(d, "token_positions", numpy_copy(in->token_positions, T, 4, "int32"));
  rc |= set_item(d, "token_ids", in->token_ids ? numpy_copy(in->token_ids, T, 4, "int32") : Py_NewRef(Py_None));
  rc |= set_item(d, "slot_mapping", numpy_copy(in->slot_mapping, T, 8, "int64"));
  rc |= set_item(d, "token_context_lens", numpy_copy(in->token_context_lens, T, 4, "int32"));
  rc |= set_item(d, "num_logits", PyLong_FromSsize_t(L));
  rc |= set_item(d, "logits_indices", numpy_copy(in->logits_indices, L, 4, "int32"));
  rc |= set_item(d, "logits_groups", numpy_copy(in->logits_groups, L, 4, "int32"));
  rc |= set_item(d, "new_token_positions", numpy_copy(in->new_token_positions, L, 4, "int32"));
  rc |= set_item(d, "num_invalid_reqs", PyLong_FromLong(in->num_invalid_reqs));
  rc |= set_item(d, "invalid_req_indices", numpy_copy(in->invalid_req_indices, in->num_invalid_reqs, 4, "int32"));
  rc |= set_item(d, "num_shared_blocks", PyLong_FromLong(in->num_shared_blocks));
  rc |= set_item(d, "shared_blocks", numpy_copy(in->shared_blocks, in->num_shared_blocks, 4, "int32"));
  rc |= set_item(d, "num_shared_spans", PyLong_FromLong(in->num_shared_spans));
  rc |= set_item(d, "num_unique_blocks", PyLong_FromLong(in->num_unique_blocks));
  if (!rc) {
    void *p;
    Py_ssize_t n = in->num_shared_spans;
    PyObject *a = new_numpy(1, &n, span_dtype, &p);
    if (a && n) memcpy(p, in->shared_spans, (size_t)n * sizeof(uattn_shared_span));
    rc |= set_item(d, "shared_spans", a);
    n = in->num_unique_blocks;
    a = rc ? NULL : new_numpy(1, &n, unique_dtype, &p);
    if (a && n) memcpy(p, in->unique_blocks, (size_t)n * sizeof(uattn_unique_block));
    rc |= set_item(d, "unique_blocks", a);
  }
  rc |= set_item(d, "exact", bucket_tuple(&in->exact));
  rc |= set_item(d, "padded", bucket_tuple(&in->padded));
  rc |= set_item(d, "bucket_fallback", PyBool_FromLong(in->bucket_fallback));
  if (rc) {
    Py_DECREF(d);
    return NULL;
  }
  PyObject *empty = PyTuple_New(0);
  PyObject *ns = empty ? PyObject_Call(simple_namespace, empty, d) : NULL;
  Py_XDECREF(empty);
  Py_DECREF(d);
  return ns;
}

static PyObject *Plan_step(PlanObject *self, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"num_computed", "num_scheduled", "num_prompt",       "block_table",
                           "token_ids",    "draft_tokens",  "async_scheduling", NULL};
  PyObject *nc_o, *ns_o, *np_o, *bt_o, *ids_o = Py_None, *drafts_o = Py_None;
  int async = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOOO|OOp:step", kwlist, &nc_o, &ns_o, &np_o, &bt_o, &ids_o, &drafts_o,
                                   &async))
    return NULL;
  if (plan_ready(self)) return NULL;
  array a[5];
  memset(a, 0, sizeof a);
  int32_t *dtok = NULL, *doff = NULL;
  PyObject *result = NULL;
  if (array_index(&a[0], nc_o, "num_computed", 1)) goto done;
  Py_ssize_t R = a[0].shape[0];
  Py_ssize_t want1[1] = {R}, want2[2] = {R, -1};
  if (array_index(&a[1], ns_o, "num_scheduled", 1) || array_shape(&a[1], 1, want1) ||
      array_index(&a[2], np_o, "num_prompt", 1) || array_shape(&a[2], 1, want1) ||
      array_index(&a[3], bt_o, "block_table", 2) || array_shape(&a[3], 2, want2))
    goto done;
  if (R > INT32_MAX || a[3].shape[1] > INT32_MAX) {
    PyErr_SetString(PyExc_ValueError, "block_table: more than 2^31-1 rows or columns");
    goto done;
  }
  uattn_step s = {.num_reqs = (int32_t)R,
                  .num_computed = a[0].data,
                  .num_scheduled = a[1].data,
                  .num_prompt = a[2].data,
                  .block_table = a[3].data,
                  .block_table_stride = (int32_t)a[3].shape[1],
                  .async_scheduling = async};
  if (ids_o != Py_None) {
    if (array_index(&a[4], ids_o, "token_ids", 2) || array_shape(&a[4], 2, want2)) goto done;
    s.token_ids = a[4].data;
    s.token_ids_stride = (int32_t)a[4].shape[1];
  }
  if (drafts_o != Py_None) {
    if (drafts_to_csr(drafts_o, (int32_t)R, &dtok, &doff)) goto done;
    s.draft_tokens = dtok;
    s.draft_offsets = doff;
  }
  uattn_status st;
  Py_BEGIN_ALLOW_THREADS PyThread_acquire_lock(self->lock, WAIT_LOCK);
  st = uattn_plan_step(self->plan, &s);
  Py_END_ALLOW_THREADS if (st != UATTN_OK) { raise_status(st); }
  else {
    uattn_plan_info info;
    st = uattn_plan_get_info(self->plan, &info);
    result = st == UATTN_OK ? info_object(&info) : raise_status(st);
  }
  PyThread_release_lock(self->lock);
done:
  for (int i = 0; i < 5; i++) array_release(&a[i]);
  PyMem_Free(dtok);
  PyMem_Free(doff);
  return result;
}

static PyObject *Plan_info(PlanObject *self, PyObject *unused) {
  if (plan_ready(self)) return NULL;
  plan_acquire(self);
  uattn_plan_info info;
  uattn_status st = uattn_plan_get_info(self->plan, &info);
  PyObject *r = st == UATTN_OK ? info_object(&info) : raise_status(st);
  PyThread_release_lock(self->lock);
  return r;
}

static PyObject *Plan_stats(PlanObject *self, void *closure) {
  if (plan_ready(self)) return NULL;
  uattn_plan_stats s;
  uattn_status st = uattn_plan_get_stats(self->plan, &s);
  if (st != UATTN_OK) return raise_status(st);
  return Py_BuildValue("{s:L,s:L,s:L,s:n}", "steps", (long long)s.steps, "bucket_fallbacks",
                       (long long)s.bucket_fallbacks, "allocations", (long long)s.allocations, "bytes_reserved",
                       (Py_ssize_t)s.bytes_reserved);
}

static PyObject *Plan_cfg(PlanObject *self, void *which) {
  const uattn_plan_config *c = &self->cfg;
  int32_t v[] = {c->block_size,    c->num_blocks, c->max_num_seqs, c->max_num_batched_tokens,
                 c->max_model_len, c->chunk_size};
  return PyLong_FromLong(v[(intptr_t)which]);
}

static PyMethodDef Plan_methods[] = {
    {"step", (PyCFunction)(void (*)(void))Plan_step, METH_VARARGS | METH_KEYWORDS,
     "step(num_computed, num_scheduled, num_prompt, block_table, token_ids=None, draft_tokens=None,\n"
     "     async_scheduling=False) -> info\n\n"
     "Plans one step. Index arguments are int32 arrays (or lists); block_table and token_ids are\n"
     "[num_reqs, columns]; draft_tokens is one sequence of draft ids (or None) per request. info holds\n"
     "uattn_plan_info's fields as NumPy arrays (copies: the plan reuses its buffers next step)."},
    {"info", (PyCFunction)Plan_info, METH_NOARGS, "The last step's info again."},
    {NULL}};

#define PLAN_ATTR(name, i)                                                                                             \
  { name, (getter)Plan_cfg, NULL, NULL, (void *)(intptr_t)(i) }
static PyGetSetDef Plan_getset[] = {
    PLAN_ATTR("block_size", 0),
    PLAN_ATTR("num_blocks", 1),
    PLAN_ATTR("max_num_seqs", 2),
    PLAN_ATTR("max_num_batched_tokens", 3),
    PLAN_ATTR("max_model_len", 4),
    PLAN_ATTR("chunk_size", 5),
    {"stats", (getter)Plan_stats, NULL, "steps, bucket_fallbacks, allocations, bytes_reserved", NULL},
    {NULL}};

static PyTypeObject Plan_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "uattn.Plan",
    .tp_basicsize = sizeof(PlanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "Plan(block_size, num_blocks, max_num_seqs, max_num_batched_tokens, max_model_len,\n"
        "     chunk_size=0, split_min_keys=0, split_keys=0, bucketing=\"none\")\n\n"
        "The unified-batch planner: one per engine (or per engine thread), stepped once per step.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Plan_init,
    .tp_dealloc = (destructor)Plan_dealloc,
    .tp_methods = Plan_methods,
    .tp_getset = Plan_getset,
};

/* ---- forward ---------------------------------------------------------------------------------------- */

static enum kind kind_of_dtype(uattn_dtype d, enum kind *alt, const char **desc) {
  switch (d) {
  case UATTN_F32:
    *alt = K_OTHER;
    *desc = "float32";
    return K_F32;
  case UATTN_F16:
    *alt = K_OTHER;
    *desc = "float16";
    return K_F16;
  case UATTN_FP8_E4M3:
  case UATTN_FP8_E5M2:
    *alt = K_OTHER;
    *desc = "uint8 (the fp8 cache's codes)";
    return K_U8;
  default:
    *alt = K_BF16;
    *desc = "bf16 (uint16 bits, or a bfloat16 tensor)";
    return K_U16;
  }
}

/* numpy's name for the dtype an output of this dtype gets; bf16 travels as its bits */
static const char *numpy_dtype_name(uattn_dtype d) {
  return d == UATTN_F32 ? "float32" : d == UATTN_F16 ? "float16" : "uint16";
}

/* An output in the kind of q: q.new_empty(shape[, dtype]) for a tensor that has it (PyTorch), else NumPy. */
static PyObject *new_like(PyObject *q, const array *qa, int ndim, const Py_ssize_t *shape, int f32) {
  if (qa->from_dlpack && PyObject_HasAttrString(q, "new_empty")) {
    PyObject *shp = PyTuple_New(ndim);
    if (!shp) return NULL;
    for (int i = 0; i < ndim; i++) PyTuple_SET_ITEM(shp, i, PyLong_FromSsize_t(shape[i]));
    PyObject *r = NULL;
    if (!f32) {
      r = PyObject_CallMethod(q, "new_empty", "O", shp);
    } else {
      PyObject *torch = PyImport_ImportModule("torch");
      PyObject *f = torch ? PyObject_GetAttrString(torch, "float32") : NULL;
      PyObject *meth = f ? PyObject_GetAttrString(q, "new_empty") : NULL;
      PyObject *targs = meth ? PyTuple_Pack(1, shp) : NULL;
      PyObject *kw = targs ? Py_BuildValue("{s:O}", "dtype", f) : NULL;
      r = kw ? PyObject_Call(meth, targs, kw) : NULL;
      Py_XDECREF(kw);
      Py_XDECREF(targs);
      Py_XDECREF(meth);
      Py_XDECREF(f);
      Py_XDECREF(torch);
    }
    Py_DECREF(shp);
    return r;
  }
  return NULL; /* the caller makes a NumPy array */
}

enum { A_Q, A_K, A_V, A_KC, A_VC, A_OUT, A_LSE, A_ENC, A_CBT, A_N };

static PyObject *py_forward(PyObject *mod, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"plan",
                           "layer",
                           "q",
                           "k",
                           "v",
                           "key_cache",
                           "value_cache",
                           "runtime",
                           "out",
                           "return_lse",
                           "lse",
                           "encoder_lens",
                           "cross_block_table",
                           NULL};
  PyObject *plan_o, *layer_o, *q_o, *k_o, *v_o, *kc_o, *vc_o, *rt_o = Py_None, *out_o = Py_None, *lse_o = Py_None;
  PyObject *enc_o = Py_None, *cbt_o = Py_None;
  int return_lse = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!OOOOO|OOpOOO:forward", kwlist, &Plan_Type, &plan_o, &Layer_Type,
                                   &layer_o, &q_o, &k_o, &v_o, &kc_o, &vc_o, &rt_o, &out_o, &return_lse, &lse_o, &enc_o,
                                   &cbt_o))
    return NULL;
  PlanObject *plan = (PlanObject *)plan_o;
  const uattn_layer *L = &((LayerObject *)layer_o)->layer;
  RuntimeObject *rt = NULL;
  if (rt_o != Py_None) {
    if (!PyObject_TypeCheck(rt_o, &Runtime_Type)) {
      PyErr_Format(PyExc_TypeError, "runtime: expected a uattn.Runtime or None, got %s", Py_TYPE(rt_o)->tp_name);
      return NULL;
    }
    rt = (RuntimeObject *)rt_o;
    if (!rt->rt) {
      PyErr_SetString(PyExc_ValueError, "runtime: the runtime is closed");
      return NULL;
    }
  }
  if (plan_ready(plan)) return NULL;

  array a[A_N];
  memset(a, 0, sizeof a);
  PyObject *out = NULL, *lse = NULL, *result = NULL;
  int locked = 0;
  plan_acquire(plan);
  locked = 1;
  uattn_plan_info info;
  uattn_status st = uattn_plan_get_info(plan->plan, &info);
  if (st != UATTN_OK) {
    raise_status(st);
    goto done;
  }
  const Py_ssize_t T = info.num_tokens, Hq = L->num_q_heads, Hkv = L->num_kv_heads, D = L->head_dim;
  const Py_ssize_t bs = plan->cfg.block_size;
  enum kind alt, calt;
  const char *desc, *cdesc;
  enum kind want = kind_of_dtype(L->dtype, &alt, &desc);
  enum kind cwant = kind_of_dtype(L->cache_dtype, &calt, &cdesc);
  const Py_ssize_t qshape[3] = {T, Hq, D}, kvshape[3] = {T, Hkv, D};
  if (array_get(&a[A_Q], q_o, "q", 0) || array_kind(&a[A_Q], want, alt, desc) || array_shape(&a[A_Q], 3, qshape) ||
      array_get(&a[A_K], k_o, "k", 0) || array_kind(&a[A_K], want, alt, desc) || array_shape(&a[A_K], 3, kvshape) ||
      array_get(&a[A_V], v_o, "v", 0) || array_kind(&a[A_V], want, alt, desc) || array_shape(&a[A_V], 3, kvshape))
    goto done;

  /* The caches: NHD as [num_blocks * block_size, Hkv, D] (uattn.h) or [num_blocks, block_size, Hkv, D]
   * (vLLM's), HND as [num_blocks, Hkv, block_size, D], both caches alike; TILED as uattn.h's
   * [num_blocks, block_size / 16, Hkv, D / 2, 16, 2] keys and [num_blocks, block_size / 16, Hkv, 8, D, 2]
   * values. */
  Py_ssize_t num_blocks = -1;
  PyObject *cache_objs[2] = {kc_o, vc_o};
  const char *cache_names[2] = {"key_cache", "value_cache"};
  for (int c = 0; c < 2; c++) {
    array *ca = &a[A_KC + c];
    if (array_get(ca, cache_objs[c], cache_names[c], 1) || array_kind(ca, cwant, calt, cdesc)) goto done;
    Py_ssize_t nb = -1;
    if (L->kv_layout == UATTN_LAYOUT_TILED) {
      /* TILED's shapes exist only for these; the library refuses the others too, but the shape check below
       * would first name a shape that cannot be */
      if (bs % 16 || D % 2) {
        fail_arg(ca,
                 "kv_layout \"TILED\" needs a block_size that is a multiple of 16 and an even head_dim, got "
                 "%zd and %zd",
                 bs, D);
        goto done;
      }
      Py_ssize_t wk[6] = {num_blocks, bs / 16, Hkv, D / 2, 16, 2}, wv[6] = {num_blocks, bs / 16, Hkv, 8, D, 2};
      if (array_shape(ca, 6, c ? wv : wk)) goto done;
      nb = ca->shape[0];
    } else if (L->kv_layout == UATTN_LAYOUT_HND) {
      Py_ssize_t w[4] = {num_blocks, Hkv, bs, D};
      if (array_shape(ca, 4, w)) goto done;
      nb = ca->shape[0];
    } else if (ca->ndim == 4) {
      Py_ssize_t w[4] = {num_blocks, bs, Hkv, D};
      if (array_shape(ca, 4, w)) goto done;
      nb = ca->shape[0];
    } else {
      Py_ssize_t w[3] = {num_blocks < 0 ? -1 : num_blocks * bs, Hkv, D};
      if (array_shape(ca, 3, w)) goto done;
      if (ca->shape[0] % bs) {
        fail_arg(ca, "its %zd rows are not whole blocks of the plan's block_size %zd", ca->shape[0], bs);
        goto done;
      }
      nb = ca->shape[0] / bs;
    }
    if (nb > INT32_MAX) {
      fail_arg(ca, "more than 2^31-1 blocks");
      goto done;
    }
    num_blocks = nb;
  }
  if (a[A_KC].data == a[A_VC].data && num_blocks > 0) {
    PyErr_SetString(PyExc_ValueError, "value_cache: the same memory as key_cache");
    goto done;
  }

  uattn_cross cross = {0};
  if (enc_o != Py_None || cbt_o != Py_None) {
    Py_ssize_t w1[1] = {info.num_reqs}, w2[2] = {info.num_reqs, -1};
    if (enc_o == Py_None || cbt_o == Py_None) {
      PyErr_SetString(PyExc_ValueError, "encoder_lens, cross_block_table: give both or neither");
      goto done;
    }
    if (array_index(&a[A_ENC], enc_o, "encoder_lens", 1) || array_shape(&a[A_ENC], 1, w1) ||
        array_index(&a[A_CBT], cbt_o, "cross_block_table", 2) || array_shape(&a[A_CBT], 2, w2))
      goto done;
    cross.encoder_lens = a[A_ENC].data;
    cross.block_table = a[A_CBT].data;
    cross.block_table_stride = (int32_t)a[A_CBT].shape[1];
  }

  if (out_o != Py_None) {
    if (array_checked(&a[A_OUT], out_o, "out", 1, want, alt, desc, 3, qshape)) goto done;
    out = Py_NewRef(out_o);
  } else {
    out = new_like(q_o, &a[A_Q], 3, qshape, 0);
    if (!out && PyErr_Occurred()) goto done;
    if (!out) {
      void *p;
      out = new_numpy_str(3, qshape, numpy_dtype_name(L->dtype), &p);
      if (!out) goto done;
    }
    if (array_get(&a[A_OUT], out, "out", 1)) goto done;
  }
  const Py_ssize_t lshape[2] = {T, Hq};
  if (lse_o != Py_None) {
    if (array_f32(&a[A_LSE], lse_o, "lse", 1, 2, lshape)) goto done;
    lse = Py_NewRef(lse_o);
  } else if (return_lse) {
    lse = new_like(q_o, &a[A_Q], 2, lshape, 1);
    if (!lse && PyErr_Occurred()) goto done;
    if (!lse) {
      void *p;
      lse = new_numpy_str(2, lshape, "float32", &p);
      if (!lse) goto done;
    }
    if (array_get(&a[A_LSE], lse, "lse", 1)) goto done;
  }

  uattn_tensors t = {.q = a[A_Q].data,
                     .k = a[A_K].data,
                     .v = a[A_V].data,
                     .key_cache = a[A_KC].data,
                     .value_cache = a[A_VC].data,
                     .num_blocks = (int32_t)num_blocks,
                     .block_size = (int32_t)bs,
                     .out = a[A_OUT].data,
                     .lse = a[A_LSE].data,
                     .cross = cross.encoder_lens ? &cross : NULL};
  uattn_runtime *crt = rt ? rt->rt : NULL;
  if (rt) rt->in_use++;
  Py_BEGIN_ALLOW_THREADS st = uattn_forward(plan->plan, L, &t, crt);
  Py_END_ALLOW_THREADS if (rt) rt->in_use--;
  if (st != UATTN_OK) {
    raise_status(st);
    goto done;
  }
  if (lse && (return_lse || lse_o != Py_None))
    result = PyTuple_Pack(2, out, lse);
  else
    result = Py_NewRef(out);

done:
  for (int i = 0; i < A_N; i++) array_release(&a[i]);
  if (locked) PyThread_release_lock(plan->lock);
  Py_XDECREF(out);
  Py_XDECREF(lse);
  return result;
}

/* ---- merge_states ------------------------------------------------------------------------------------ */

/* A float32 output: the caller's array (`given`, checked), or a new one for None. *obj gets a new reference,
 * also on a failure after it was made, for the caller to release. */
static int f32_output(array *a, PyObject *given, const char *name, int ndim, const Py_ssize_t *shape, PyObject **obj) {
  if (given != Py_None) {
    if (array_f32(a, given, name, 1, ndim, shape)) return -1;
    *obj = Py_NewRef(given);
    return 0;
  }
  void *p;
  if (!(*obj = new_numpy_str(ndim, shape, "float32", &p))) return -1;
  return array_get(a, *obj, name, 1);
}

static PyObject *py_merge_states(PyObject *mod, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"outs", "lses", "out", "lse", NULL};
  PyObject *outs_o, *lses_o, *out_o = Py_None, *lse_o = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|OO:merge_states", kwlist, &outs_o, &lses_o, &out_o, &lse_o))
    return NULL;
  PyObject *outs = PySequence_Fast(outs_o, "outs: expected a sequence of arrays");
  if (!outs) return NULL;
  PyObject *lses = PySequence_Fast(lses_o, "lses: expected a sequence of arrays");
  if (!lses) {
    Py_DECREF(outs);
    return NULL;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(outs);
  PyObject *result = NULL, *out = NULL, *lse = NULL;
  array *a = NULL;
  const float **po = NULL, **pl = NULL;
  char(*names)[32] = NULL;
  if (n < 1 || n > INT32_MAX / 2 || PySequence_Fast_GET_SIZE(lses) != n) {
    PyErr_Format(PyExc_ValueError, "outs, lses: expected the same number (>= 1) of each, got %zd and %zd", n,
                 PySequence_Fast_GET_SIZE(lses));
    goto done;
  }
  a = PyMem_Calloc((size_t)(2 * n + 2), sizeof(array));
  po = PyMem_Calloc((size_t)n, sizeof(float *));
  pl = PyMem_Calloc((size_t)n, sizeof(float *));
  names = PyMem_Calloc((size_t)(2 * n), 32);
  if (!a || !po || !pl || !names) {
    PyErr_NoMemory();
    goto done;
  }
  Py_ssize_t oshape[3] = {-1, -1, -1}, lshape[2];
  for (Py_ssize_t i = 0; i < n; i++) {
    snprintf(names[2 * i], 32, "outs[%zd]", i);
    snprintf(names[2 * i + 1], 32, "lses[%zd]", i);
    if (array_f32(&a[2 * i], PySequence_Fast_ITEMS(outs)[i], names[2 * i], 0, 3, oshape)) goto done;
    for (int d = 0; d < 3; d++) oshape[d] = a[0].shape[d];
    lshape[0] = oshape[0], lshape[1] = oshape[1];
    if (array_f32(&a[2 * i + 1], PySequence_Fast_ITEMS(lses)[i], names[2 * i + 1], 0, 2, lshape)) goto done;
    po[i] = a[2 * i].data;
    pl[i] = a[2 * i + 1].data;
  }
  if (oshape[0] > INT32_MAX || oshape[1] > INT32_MAX || oshape[2] > INT32_MAX) {
    PyErr_SetString(PyExc_ValueError, "outs: a dimension above 2^31-1");
    goto done;
  }
  array *ao = &a[2 * n], *al = &a[2 * n + 1];
  if (f32_output(ao, out_o, "out", 3, oshape, &out) || f32_output(al, lse_o, "lse", 2, lshape, &lse)) goto done;
  uattn_status st;
  Py_BEGIN_ALLOW_THREADS st = uattn_merge_states((int32_t)n, po, pl, (int32_t)oshape[0], (int32_t)oshape[1],
                                                 (int32_t)oshape[2], ao->data, al->data);
  Py_END_ALLOW_THREADS if (st != UATTN_OK) raise_status(st);
  else result = PyTuple_Pack(2, out, lse);
done:
  if (a)
    for (Py_ssize_t i = 0; i < 2 * n + 2; i++) array_release(&a[i]);
  PyMem_Free(a);
  PyMem_Free(po);
  PyMem_Free(pl);
  PyMem_Free(names);
  Py_XDECREF(out);
  Py_XDECREF(lse);
  Py_DECREF(outs);
  Py_DECREF(lses);
  return result;
}

/* ---- kernel reports ------------------------------------------------------------------------------- */

static PyObject *report_dict(const uattn_kernel_report *r) {
  static const char *parts[] = {"causal", "shared", "unique"};
  PyObject *pk = PyDict_New(), *pc = PyDict_New(), *dc = PyDict_New();
  int rc = !pk || !pc || !dc;
  for (int i = 0; !rc && i < UATTN_NUM_PARTS; i++) {
    rc |= set_item(pk, parts[i], PyUnicode_FromString(r->part_kernel[i]));
    rc |= set_item(pc, parts[i], PyLong_FromLongLong(r->part_calls[i]));
    rc |= set_item(dc, parts[i], PyLong_FromLongLong(r->decode_calls[i]));
  }
  if (rc) {
    Py_XDECREF(pk);
    Py_XDECREF(pc);
    Py_XDECREF(dc);
    return NULL;
  }
  return Py_BuildValue("{s:i,s:i,s:s,s:i,s:O,s:s,s:N,s:s,s:O,s:s,s:N,s:N,s:n,s:i}", "block_size", r->block_size,
                       "head_dim", r->head_dim, "cache_dtype", dtype_str(r->cache_dtype), "chunk_size", r->chunk_size,
                       "bucket_hit", r->bucket_hit ? Py_True : Py_False, "kernel_set",
                       r->kernel_set ? r->kernel_set : "", "part_kernel", pk, "decode_kernel", r->decode_kernel,
                       "panels_gathered", r->panels_gathered ? Py_True : Py_False, "reason", r->reason, "part_calls",
                       pc, "decode_calls", dc, "workspace_bytes", (Py_ssize_t)r->workspace_bytes, "workers",
                       r->workers);
}

static PyObject *py_last_forward_report(PyObject *mod, PyObject *unused) {
  uattn_kernel_report r;
  uattn_status st = uattn_last_forward_report(&r);
  if (st != UATTN_OK) return raise_status(st);
  return report_dict(&r);
}

static PyObject *py_describe_kernels(PyObject *mod, PyObject *args) {
  PyObject *layer;
  int bs;
  if (!PyArg_ParseTuple(args, "O!i:describe_kernels", &Layer_Type, &layer, &bs)) return NULL;
  uattn_kernel_report r;
  uattn_status st = uattn_describe_kernels(&((LayerObject *)layer)->layer, bs, &r);
  if (st != UATTN_OK) return raise_status(st);
  return report_dict(&r);
}

static PyObject *py_kernel_buckets(PyObject *mod, PyObject *unused) {
  int32_t n = uattn_kernel_buckets(NULL, 0);
  uattn_kernel_bucket *b = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof *b);
  if (!b) return PyErr_NoMemory();
  n = uattn_kernel_buckets(b, n);
  PyObject *list = PyList_New(n);
  for (int32_t i = 0; list && i < n; i++) {
    PyObject *d = Py_BuildValue("{s:s,s:i,s:i,s:i,s:s,s:O}", "dtype", dtype_str(b[i].dtype), "block_size",
                                b[i].block_size, "head_dim", b[i].head_dim, "chunk_size", b[i].chunk_size, "isa",
                                b[i].isa ? b[i].isa : "", "runs_here", b[i].runs_here ? Py_True : Py_False);
    if (!d)
      Py_CLEAR(list);
    else
      PyList_SET_ITEM(list, i, d);
  }
  PyMem_Free(b);
  return list;
}

static PyObject *py_kernel_set(PyObject *mod, PyObject *unused) {
  const char *why = NULL;
  const char *name = uattn_kernel_set(&why);
  return Py_BuildValue("(ss)", name, why ? why : "");
}

/* ---- vLLM batch utilities --------------------------------------------------------------------------- */

static PyObject *py_split_decodes_and_prefills(PyObject *mod, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"query_start_loc", "num_tokens", "decode_threshold", "require_uniform", NULL};
  PyObject *qsl_o, *nt_o = Py_None;
  int threshold = 1, uniform = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Oip:split_decodes_and_prefills", kwlist, &qsl_o, &nt_o, &threshold,
                                   &uniform))
    return NULL;
  array a;
  if (array_index(&a, qsl_o, "query_start_loc", 1)) {
    array_release(&a);
    return NULL;
  }
  PyObject *r = NULL;
  if (a.shape[0] < 1) {
    fail_arg(&a, "expected num_reqs + 1 >= 1 entries, got 0");
    goto done;
  }
  int32_t R = (int32_t)(a.shape[0] - 1);
  long nt = ((const int32_t *)a.data)[R];
  if (nt_o != Py_None) {
    nt = PyLong_AsLong(nt_o);
    if (nt == -1 && PyErr_Occurred()) goto done;
  }
  if (nt < INT32_MIN || nt > INT32_MAX) {
    PyErr_SetString(PyExc_ValueError, "num_tokens: expected an int32");
    goto done;
  }
  uattn_batch_split s;
  uattn_status st = uattn_split_decodes_and_prefills(R, a.data, (int32_t)nt, threshold, uniform, &s);
  if (st != UATTN_OK)
    raise_status(st);
  else
    r = Py_BuildValue("(iiii)", s.num_decodes, s.num_prefills, s.num_decode_tokens, s.num_prefill_tokens);
done:
  array_release(&a);
  return r;
}

/* Both reorders: objs are num_scheduled, num_computed and (with_prompt) num_prompt, one length. */
static PyObject *reorder_swaps(PyObject *const *objs, bool with_prompt, int threshold) {
  static const char *names[] = {"num_scheduled", "num_computed", "num_prompt"};
  const int narr = with_prompt ? 3 : 2;
  array a[3];
  memset(a, 0, sizeof a);
  PyObject *r = NULL, *order = NULL, *swaps = NULL;
  uattn_swap *sw = NULL;
  Py_ssize_t want[1] = {-1};
  for (int i = 0; i < narr; i++) {
    if (array_index(&a[i], objs[i], names[i], 1) || array_shape(&a[i], 1, want)) goto done;
    want[0] = a[i].shape[0];
  }
  int32_t R = (int32_t)want[0], ns = 0;
  void *op;
  order = new_numpy_str(1, want, "int32", &op);
  sw = PyMem_Malloc((size_t)(R > 0 ? R : 1) * sizeof *sw);
  if (!order || !sw) {
    if (!sw) PyErr_NoMemory();
    goto done;
  }
  uattn_status st =
      with_prompt
          ? uattn_reorder_batch_with_prompt_lens(R, a[0].data, a[1].data, a[2].data, threshold, sw, R, &ns, op)
          : uattn_reorder_batch_to_split_decodes_and_prefills(R, a[0].data, a[1].data, threshold, sw, R, &ns, op);
  if (st != UATTN_OK) {
    raise_status(st);
    goto done;
  }
  swaps = PyList_New(ns);
  for (int32_t i = 0; swaps && i < ns; i++) PyList_SET_ITEM(swaps, i, Py_BuildValue("(ii)", sw[i].a, sw[i].b));
  if (swaps) r = PyTuple_Pack(2, swaps, order);
done:
  for (int i = 0; i < narr; i++) array_release(&a[i]);
  PyMem_Free(sw);
  Py_XDECREF(swaps);
  Py_XDECREF(order);
  return r;
}

static PyObject *py_reorder(PyObject *mod, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"num_scheduled", "num_computed", "decode_threshold", NULL};
  PyObject *objs[2];
  int threshold = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|i:reorder_batch_to_split_decodes_and_prefills", kwlist, &objs[0],
                                   &objs[1], &threshold))
    return NULL;
  return reorder_swaps(objs, false, threshold);
}

static PyObject *py_reorder_with_prompt_lens(PyObject *mod, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"num_scheduled", "num_computed", "num_prompt", "decode_threshold", NULL};
  PyObject *objs[3];
  int threshold = 1;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO|i:reorder_batch_with_prompt_lens", kwlist, &objs[0], &objs[1],
                                   &objs[2], &threshold))
    return NULL;
  return reorder_swaps(objs, true, threshold);
}

static PyObject *py_compute_slot_mapping(PyObject *mod, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"is_profile_run", "seq_len", "context_len", "start_idx", "block_size", "block_table", NULL};
  int profile, seq_len, context_len, start_idx, bs;
  PyObject *bt_o = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "piiii|O:compute_slot_mapping", kwlist, &profile, &seq_len, &context_len,
                                   &start_idx, &bs, &bt_o))
    return NULL;
  array a;
  memset(&a, 0, sizeof a);
  PyObject *out = NULL, *r = NULL;
  if (bt_o != Py_None && array_index(&a, bt_o, "block_table", 1)) goto done;
  Py_ssize_t cap = seq_len > 0 ? seq_len : 0;
  void *p;
  if (!(out = new_numpy_str(1, &cap, "int64", &p))) goto done;
  int32_t n = 0;
  uattn_status st = uattn_compute_slot_mapping(profile, seq_len, context_len, start_idx, bs, a.data,
                                               (int32_t)(a.data ? a.shape[0] : 0), p, (int32_t)cap, &n);
  if (st != UATTN_OK)
    raise_status(st);
  else
    r = PySequence_GetSlice(out, 0, n);
done:
  array_release(&a);
  Py_XDECREF(out);
  return r;
}

/* ---- the module ----------------------------------------------------------------------------------- */

static PyMethodDef module_methods[] = {
    {"forward", (PyCFunction)(void (*)(void))py_forward, METH_VARARGS | METH_KEYWORDS,
     "forward(plan, layer, q, k, v, key_cache, value_cache, runtime=None, out=None, return_lse=False,\n"
     "        lse=None, encoder_lens=None, cross_block_table=None) -> out | (out, lse)\n\n"
     "Writes this step's k/v into the caches (in place) and computes attention for every query row of the\n"
     "plan's last step. q [T, Hq, D], k/v [T, Hkv, D] in layer.dtype (bf16: uint16 bits or a bfloat16\n"
     "tensor); caches in layer.cache_dtype: NHD [num_blocks * block_size, Hkv, D] or\n"
     "[num_blocks, block_size, Hkv, D], HND [num_blocks, Hkv, block_size, D], TILED keys\n"
     "[num_blocks, block_size / 16, Hkv, D / 2, 16, 2] and values [num_blocks, block_size / 16, Hkv, 8, D, 2]\n"
     "(uattn.h). out is made in the kind of q unless given; lse [T, Hq] float32. The GIL is released while it\n"
     "runs."},
    {"merge_states", (PyCFunction)(void (*)(void))py_merge_states, METH_VARARGS | METH_KEYWORDS,
     "merge_states(outs, lses, out=None, lse=None) -> (out, lse)\n\n"
     "Merges attention results over disjoint key sets: float32 outs [rows, heads, D], lses [rows, heads]."},
    {"last_forward_report", py_last_forward_report, METH_NOARGS,
     "What served this thread's last forward: kernels per part, why, calls, scratch, workers (a dict)."},
    {"describe_kernels", py_describe_kernels, METH_VARARGS,
     "describe_kernels(layer, block_size): which kernels a forward of this layer would run."},
    {"kernel_buckets", py_kernel_buckets, METH_NOARGS, "The kernel buckets generated into this build (dicts)."},
    {"kernel_set", py_kernel_set, METH_NOARGS, "(name, why): the generic kernel set this CPU runs."},
    {"split_decodes_and_prefills", (PyCFunction)(void (*)(void))py_split_decodes_and_prefills,
     METH_VARARGS | METH_KEYWORDS,
     "split_decodes_and_prefills(query_start_loc, num_tokens=None, decode_threshold=1, require_uniform=False)\n"
     "-> (num_decodes, num_prefills, num_decode_tokens, num_prefill_tokens), as vLLM's."},
    {"reorder_batch_to_split_decodes_and_prefills", (PyCFunction)(void (*)(void))py_reorder,
     METH_VARARGS | METH_KEYWORDS,
     "reorder_batch_to_split_decodes_and_prefills(num_scheduled, num_computed, decode_threshold=1)\n"
     "-> (swaps, order): the fewest swaps [(a, b), ...] that put decodes first, then extends, then prefills,\n"
     "and the original position of the request at each position afterwards. An empty list: no change."},
    {"reorder_batch_with_prompt_lens", (PyCFunction)(void (*)(void))py_reorder_with_prompt_lens,
     METH_VARARGS | METH_KEYWORDS,
     "reorder_batch_with_prompt_lens(num_scheduled, num_computed, num_prompt, decode_threshold=1)\n"
     "-> (swaps, order) for today's vLLM's four regions: decodes, short extends (prompt chunks of at most\n"
     "decode_threshold tokens), long extends, prefills; the fewest swaps, order within a region not kept."},
    {"compute_slot_mapping", (PyCFunction)(void (*)(void))py_compute_slot_mapping, METH_VARARGS | METH_KEYWORDS,
     "compute_slot_mapping(is_profile_run, seq_len, context_len, start_idx, block_size, block_table=None)\n"
     "-> int64 slots of positions [context_len, seq_len) (PAD_SLOT_ID before start_idx), as vLLM v0's."},
    {NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "uattn",
    .m_size = -1,
    .m_methods = module_methods,
    .m_doc =
        "uattn: unified-batch paged attention for CPUs (a C extension over libuattn).\n\n"
        "Plan (the planner), Layer, Runtime, forward, merge_states, the kernel reports and vLLM's batch\n"
        "utilities. Arrays are taken without copies (buffer protocol or __dlpack__); bf16 travels as uint16.",
};

static PyObject *make_struct_dtype(const char *const *fields, int n) {
  PyObject *list = PyList_New(n);
  for (int i = 0; list && i < n; i++) PyList_SET_ITEM(list, i, Py_BuildValue("(ss)", fields[i], "<i4"));
  if (!list) return NULL;
  PyObject *dt = PyObject_CallMethod(numpy_mod, "dtype", "O", list);
  Py_DECREF(list);
  return dt;
}

PyMODINIT_FUNC PyInit_uattn(void) {
  numpy_mod = PyImport_ImportModule("numpy");
  if (!numpy_mod) return NULL;
  numpy_empty = PyObject_GetAttrString(numpy_mod, "empty");
  PyObject *types = PyImport_ImportModule("types");
  simple_namespace = types ? PyObject_GetAttrString(types, "SimpleNamespace") : NULL;
  Py_XDECREF(types);
  if (!numpy_empty || !simple_namespace) return NULL;
  /* the field order of uattn_shared_span and uattn_unique_block (all int32, no padding) */
  static const char *const span_fields[] = {"shared_index", "req", "block_start", "token_begin", "token_end"};
  static const char *const unique_fields[] = {"block", "token", "block_start", "usage"};
  _Static_assert(sizeof(uattn_shared_span) == 5 * sizeof(int32_t), "span layout");
  _Static_assert(sizeof(uattn_unique_block) == 4 * sizeof(int32_t), "unique block layout");
  span_dtype = make_struct_dtype(span_fields, 5);
  unique_dtype = make_struct_dtype(unique_fields, 4);
  if (!span_dtype || !unique_dtype) return NULL;

  if (PyType_Ready(&Runtime_Type) || PyType_Ready(&Layer_Type) || PyType_Ready(&Plan_Type)) return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  if (PyModule_AddObjectRef(m, "Runtime", (PyObject *)&Runtime_Type) ||
      PyModule_AddObjectRef(m, "Layer", (PyObject *)&Layer_Type) ||
      PyModule_AddObjectRef(m, "Plan", (PyObject *)&Plan_Type) || add_errors(m) ||
      PyModule_AddStringConstant(m, "__version__", uattn_version()) ||
      PyModule_AddIntConstant(m, "PAD_SLOT_ID", UATTN_PAD_SLOT_ID)) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
