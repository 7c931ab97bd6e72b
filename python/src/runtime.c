/*
 * uattn.Runtime: the library's worker threads (uattn_runtime), made once per engine and passed to forward.
 */
#include "uattn_py.h"

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
    uattn_py_raise_status(st);
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
  if (st != UATTN_OK) return uattn_py_raise_status(st);
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

PyTypeObject uattn_py_runtime_type = {
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
