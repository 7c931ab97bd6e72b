/*
 * uattn for Python: a CPython extension module over the C library (include/uattn.h). This file holds the
 * module itself: its state, its exceptions and PyInit_uattn, which adds the types (runtime.c, layer.c,
 * plan.c) and the functions (forward.c, vllm.c).
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
#include <stdio.h>

#include "uattn_py.h"
#include "uattn_vllm.h"

/* ---- module state ------------------------------------------------------------------------------- */

/* the shared ones, described in uattn_py.h */
PyObject *uattn_py_numpy;
PyObject *uattn_py_numpy_empty;
PyObject *uattn_py_simple_namespace;
PyObject *uattn_py_span_dtype;
PyObject *uattn_py_unique_dtype;

static PyObject *uattn_error;                             /* uattn.Error */
static PyObject *status_error[UATTN_ERR_UNSUPPORTED + 1]; /* uattn.<Status>Error per status */

/* Raises the exception of a library status with the library's message (read at once: it is this
 * thread's and the next library call replaces it). */
PyObject *uattn_py_raise_status(uattn_status st) {
  PyObject *cls = (st > 0 && st <= UATTN_ERR_UNSUPPORTED && status_error[st]) ? status_error[st] : uattn_error;
  const char *msg = uattn_last_error();
  PyErr_Format(cls, "%s: %s", uattn_status_name(st), (msg && msg[0]) ? msg : "(no message)");
  return NULL;
}

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

/* ---- the module ----------------------------------------------------------------------------------- */

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "uattn",
    .m_size = -1,
    .m_doc =
        "uattn: unified-batch paged attention for CPUs (a C extension over libuattn).\n\n"
        "Plan (the planner), Layer, Runtime, forward, merge_states, the kernel reports and vLLM's batch\n"
        "utilities. Arrays are taken without copies (buffer protocol or __dlpack__); bf16 travels as uint16.",
};

static PyObject *make_struct_dtype(const char *const *fields, int n) {
  PyObject *list = PyList_New(n);
  for (int i = 0; list && i < n; i++) PyList_SET_ITEM(list, i, Py_BuildValue("(ss)", fields[i], "<i4"));
  if (!list) return NULL;
  PyObject *dt = PyObject_CallMethod(uattn_py_numpy, "dtype", "O", list);
  Py_DECREF(list);
  return dt;
}

PyMODINIT_FUNC PyInit_uattn(void) {
  uattn_py_numpy = PyImport_ImportModule("numpy");
  if (!uattn_py_numpy) return NULL;
  uattn_py_numpy_empty = PyObject_GetAttrString(uattn_py_numpy, "empty");
  PyObject *types = PyImport_ImportModule("types");
  uattn_py_simple_namespace = types ? PyObject_GetAttrString(types, "SimpleNamespace") : NULL;
  Py_XDECREF(types);
  if (!uattn_py_numpy_empty || !uattn_py_simple_namespace) return NULL;
  /* the field order of uattn_shared_span and uattn_unique_block (all int32, no padding) */
  static const char *const span_fields[] = {"shared_index", "req", "block_start", "token_begin", "token_end"};
  static const char *const unique_fields[] = {"block", "token", "block_start", "usage"};
  _Static_assert(sizeof(uattn_shared_span) == 5 * sizeof(int32_t), "span layout");
  _Static_assert(sizeof(uattn_unique_block) == 4 * sizeof(int32_t), "unique block layout");
  uattn_py_span_dtype = make_struct_dtype(span_fields, 5);
  uattn_py_unique_dtype = make_struct_dtype(unique_fields, 4);
  if (!uattn_py_span_dtype || !uattn_py_unique_dtype) return NULL;

  if (PyType_Ready(&uattn_py_runtime_type) || PyType_Ready(&uattn_py_layer_type) || PyType_Ready(&uattn_py_plan_type))
    return NULL;
  PyObject *m = PyModule_Create(&module_def);
  if (!m) return NULL;
  if (PyModule_AddObjectRef(m, "Runtime", (PyObject *)&uattn_py_runtime_type) ||
      PyModule_AddObjectRef(m, "Layer", (PyObject *)&uattn_py_layer_type) ||
      PyModule_AddObjectRef(m, "Plan", (PyObject *)&uattn_py_plan_type) ||
      PyModule_AddFunctions(m, uattn_py_forward_methods) || PyModule_AddFunctions(m, uattn_py_vllm_methods) ||
      add_errors(m) || PyModule_AddStringConstant(m, "__version__", uattn_version()) ||
      PyModule_AddIntConstant(m, "PAD_SLOT_ID", UATTN_PAD_SLOT_ID)) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
