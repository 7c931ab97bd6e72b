/*
 * What the files of the Python module share: the module's state (module.c), the array and object helpers
 * (arrays.c), the three types' objects (runtime.c, layer.c, plan.c) and the method tables the module adds
 * (forward.c, vllm.c). Everything declared here is hidden: the module exports PyInit_uattn alone.
 */
#ifndef UATTN_PY_H
#define UATTN_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#include <stdbool.h>
#include <stdint.h>

#include "uattn.h"

/* after the system's headers: only this module's own declarations are hidden */
#pragma GCC visibility push(hidden)

/* ---- module state (module.c) --------------------------------------------------------------------- */

extern PyObject *uattn_py_numpy;            /* numpy */
extern PyObject *uattn_py_numpy_empty;      /* numpy.empty */
extern PyObject *uattn_py_simple_namespace; /* types.SimpleNamespace, the class of Plan.step's result */
extern PyObject *uattn_py_span_dtype;       /* numpy dtype of uattn_shared_span */
extern PyObject *uattn_py_unique_dtype;     /* numpy dtype of uattn_unique_block */

/* Raises the exception of a library status with the library's message; returns NULL. */
PyObject *uattn_py_raise_status(uattn_status st);

/* ---- arrays (arrays.c) ---------------------------------------------------------------------------- */

enum kind { K_OTHER = 0, K_F32, K_F16, K_BF16, K_U16, K_F64, K_I32, K_I64, K_BOOL, K_U8 };

#define MAX_DIMS 8

struct dl_managed_tensor;

/* An array argument: the caller's memory, borrowed until uattn_py_array_release. */
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
  struct dl_managed_tensor *dl;
  PyObject *owned; /* an array converted from a list, kept alive while used */
} array;

void uattn_py_array_release(array *a);
/* Raises ValueError "<a's name>: <message>"; returns -1. */
int uattn_py_fail_arg(const array *a, const char *fmt, ...);
int uattn_py_array_get(array *a, PyObject *obj, const char *name, int writable);
int uattn_py_array_shape(array *a, int ndim, const Py_ssize_t *want);
int uattn_py_array_kind(array *a, enum kind k1, enum kind k2, const char *want);
int uattn_py_array_checked(array *a, PyObject *obj, const char *name, int writable, enum kind k1, enum kind k2,
                           const char *want, int ndim, const Py_ssize_t *shape);
int uattn_py_array_f32(array *a, PyObject *obj, const char *name, int writable, int ndim, const Py_ssize_t *shape);
int uattn_py_array_index(array *a, PyObject *obj, const char *name, int ndim);
PyObject *uattn_py_new_numpy(int ndim, const Py_ssize_t *shape, PyObject *dtype, void **data);
PyObject *uattn_py_new_numpy_str(int ndim, const Py_ssize_t *shape, const char *dtype, void **data);
PyObject *uattn_py_numpy_copy(const void *src, Py_ssize_t n, size_t elem, const char *dtype);
/* d[key] = v, taking v's reference; a NULL v (a failed call) fails. */
int uattn_py_set_item(PyObject *d, const char *key, PyObject *v);
int uattn_py_parse_dtype(PyObject *obj, const char *arg, uattn_dtype *out);
const char *uattn_py_dtype_str(uattn_dtype d);

/* ---- the types (runtime.c, layer.c, plan.c) ------------------------------------------------------- */

typedef struct {
  PyObject_HEAD uattn_runtime *rt;
  int in_use; /* forward calls running on it (counted under the GIL) */
} RuntimeObject;

typedef struct {
  PyObject_HEAD uattn_layer layer;
  float *sinks; /* owned copies: a layer outlives the arrays it was built from */
  float *alibi;
} LayerObject;

typedef struct {
  PyObject_HEAD uattn_plan *plan;
  uattn_plan_config cfg;
  /* A plan is used by one thread at a time (uattn.h). The GIL is released during step and forward, so two
   * Python threads sharing a plan would otherwise overlap: this lock serializes them. It is only taken
   * with the GIL released, so a thread waiting for it never blocks the GIL's holder. */
  PyThread_type_lock lock;
} PlanObject;

extern PyTypeObject uattn_py_runtime_type;
extern PyTypeObject uattn_py_layer_type;
extern PyTypeObject uattn_py_plan_type;

/* Takes the plan's lock, releasing the GIL while it waits. */
void uattn_py_plan_acquire(PlanObject *p);
/* 0, or -1 with RuntimeError for a Plan whose __init__ did not succeed. */
int uattn_py_plan_ready(PlanObject *p);

/* ---- the module's functions (forward.c, vllm.c) ---------------------------------------------------- */

extern PyMethodDef uattn_py_forward_methods[]; /* forward, merge_states, the kernel reports */
extern PyMethodDef uattn_py_vllm_methods[];    /* vLLM's batch utilities */

#pragma GCC visibility pop

#endif
