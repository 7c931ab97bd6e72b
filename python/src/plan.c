/*
 * uattn.Plan: the unified-batch planner (uattn_plan), stepped once per engine step; a step's info comes
 * back as a namespace of NumPy copies. Its lock keeps two Python threads from using one plan at once.
 */
#include <string.h>

#include "uattn_py.h"

void uattn_py_plan_acquire(PlanObject *p) {
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
    uattn_py_raise_status(st);
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

int uattn_py_plan_ready(PlanObject *p) {
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

/* Copies the plan's info into a namespace of NumPy arrays: the plan's own buffers change at its next step. */
static PyObject *info_object(const uattn_plan_info *in) {
  PyObject *d = PyDict_New();
  if (!d) return NULL;
  Py_ssize_t R = in->num_reqs, T = in->num_tokens, L = in->num_logits;
  int rc = 0;
  rc |= uattn_py_set_item(d, "block_size", PyLong_FromLong(in->block_size));
  rc |= uattn_py_set_item(d, "num_reqs", PyLong_FromSsize_t(R));
  rc |= uattn_py_set_item(d, "num_tokens", PyLong_FromSsize_t(T));
  rc |= uattn_py_set_item(d, "contains_prompts", PyBool_FromLong(in->contains_prompts));
  rc |= uattn_py_set_item(d, "num_scheduled", uattn_py_numpy_copy(in->num_scheduled, R, 4, "int32"));
  rc |= uattn_py_set_item(d, "query_start_loc", uattn_py_numpy_copy(in->query_start_loc, R + 1, 4, "int32"));
  rc |= uattn_py_set_item(d, "seq_lens", uattn_py_numpy_copy(in->seq_lens, R, 4, "int32"));
  rc |= uattn_py_set_item(d, "is_prompt", uattn_py_numpy_copy(in->is_prompt, R, sizeof(bool), "bool"));
  rc |= uattn_py_set_item(d, "num_output_tokens", uattn_py_numpy_copy(in->num_output_tokens, R, 4, "int32"));
  rc |= uattn_py_set_item(d, "token_groups", uattn_py_numpy_copy(in->token_groups, T, 4, "int32"));
  rc |= uattn_py_set_item(d, "token_offsets", uattn_py_numpy_copy(in->token_offsets, T, 4, "int32"));
  rc |= uattn_py_set_item(d, "token_positions", uattn_py_numpy_copy(in->token_positions, T, 4, "int32"));
  rc |= uattn_py_set_item(d, "token_ids",
                          in->token_ids ? uattn_py_numpy_copy(in->token_ids, T, 4, "int32") : Py_NewRef(Py_None));
  rc |= uattn_py_set_item(d, "slot_mapping", uattn_py_numpy_copy(in->slot_mapping, T, 8, "int64"));
  rc |= uattn_py_set_item(d, "token_context_lens", uattn_py_numpy_copy(in->token_context_lens, T, 4, "int32"));
  rc |= uattn_py_set_item(d, "num_logits", PyLong_FromSsize_t(L));
  rc |= uattn_py_set_item(d, "logits_indices", uattn_py_numpy_copy(in->logits_indices, L, 4, "int32"));
  rc |= uattn_py_set_item(d, "logits_groups", uattn_py_numpy_copy(in->logits_groups, L, 4, "int32"));
  rc |= uattn_py_set_item(d, "new_token_positions", uattn_py_numpy_copy(in->new_token_positions, L, 4, "int32"));
  rc |= uattn_py_set_item(d, "num_invalid_reqs", PyLong_FromLong(in->num_invalid_reqs));
  rc |= uattn_py_set_item(d, "invalid_req_indices",
                          uattn_py_numpy_copy(in->invalid_req_indices, in->num_invalid_reqs, 4, "int32"));
  rc |= uattn_py_set_item(d, "num_shared_blocks", PyLong_FromLong(in->num_shared_blocks));
  rc |=
      uattn_py_set_item(d, "shared_blocks", uattn_py_numpy_copy(in->shared_blocks, in->num_shared_blocks, 4, "int32"));
  rc |= uattn_py_set_item(d, "num_shared_spans", PyLong_FromLong(in->num_shared_spans));
  rc |= uattn_py_set_item(d, "num_unique_blocks", PyLong_FromLong(in->num_unique_blocks));
  if (!rc) {
    void *p;
    Py_ssize_t n = in->num_shared_spans;
    PyObject *a = uattn_py_new_numpy(1, &n, uattn_py_span_dtype, &p);
    if (a && n) memcpy(p, in->shared_spans, (size_t)n * sizeof(uattn_shared_span));
    rc |= uattn_py_set_item(d, "shared_spans", a);
    n = in->num_unique_blocks;
    a = rc ? NULL : uattn_py_new_numpy(1, &n, uattn_py_unique_dtype, &p);
    if (a && n) memcpy(p, in->unique_blocks, (size_t)n * sizeof(uattn_unique_block));
    rc |= uattn_py_set_item(d, "unique_blocks", a);
  }
  rc |= uattn_py_set_item(d, "exact", bucket_tuple(&in->exact));
  rc |= uattn_py_set_item(d, "padded", bucket_tuple(&in->padded));
  rc |= uattn_py_set_item(d, "bucket_fallback", PyBool_FromLong(in->bucket_fallback));
  if (rc) {
    Py_DECREF(d);
    return NULL;
  }
  PyObject *empty = PyTuple_New(0);
  PyObject *ns = empty ? PyObject_Call(uattn_py_simple_namespace, empty, d) : NULL;
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
  if (uattn_py_plan_ready(self)) return NULL;
  array a[5];
  memset(a, 0, sizeof a);
  int32_t *dtok = NULL, *doff = NULL;
  PyObject *result = NULL;
  if (uattn_py_array_index(&a[0], nc_o, "num_computed", 1)) goto done;
  Py_ssize_t R = a[0].shape[0];
  Py_ssize_t want1[1] = {R}, want2[2] = {R, -1};
  if (uattn_py_array_index(&a[1], ns_o, "num_scheduled", 1) || uattn_py_array_shape(&a[1], 1, want1) ||
      uattn_py_array_index(&a[2], np_o, "num_prompt", 1) || uattn_py_array_shape(&a[2], 1, want1) ||
      uattn_py_array_index(&a[3], bt_o, "block_table", 2) || uattn_py_array_shape(&a[3], 2, want2))
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
    if (uattn_py_array_index(&a[4], ids_o, "token_ids", 2) || uattn_py_array_shape(&a[4], 2, want2)) goto done;
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
  Py_END_ALLOW_THREADS if (st != UATTN_OK) { uattn_py_raise_status(st); }
  else {
    uattn_plan_info info;
    st = uattn_plan_get_info(self->plan, &info);
    result = st == UATTN_OK ? info_object(&info) : uattn_py_raise_status(st);
  }
  PyThread_release_lock(self->lock);
done:
  for (int i = 0; i < 5; i++) uattn_py_array_release(&a[i]);
  PyMem_Free(dtok);
  PyMem_Free(doff);
  return result;
}

static PyObject *Plan_info(PlanObject *self, PyObject *unused) {
  if (uattn_py_plan_ready(self)) return NULL;
  uattn_py_plan_acquire(self);
  uattn_plan_info info;
  uattn_status st = uattn_plan_get_info(self->plan, &info);
  PyObject *r = st == UATTN_OK ? info_object(&info) : uattn_py_raise_status(st);
  PyThread_release_lock(self->lock);
  return r;
}

static PyObject *Plan_stats(PlanObject *self, void *closure) {
  if (uattn_py_plan_ready(self)) return NULL;
  uattn_plan_stats s;
  uattn_status st = uattn_plan_get_stats(self->plan, &s);
  if (st != UATTN_OK) return uattn_py_raise_status(st);
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

PyTypeObject uattn_py_plan_type = {
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
