/*
 * vLLM's batch utilities over include/uattn_vllm.h: the decode/prefill split, the batch reorders and the
 * slot mapping, for an engine that keeps vLLM's own bookkeeping.
 */
#include <string.h>

#include "uattn_py.h"
#include "uattn_vllm.h"

static PyObject *py_split_decodes_and_prefills(PyObject *mod, PyObject *args, PyObject *kw) {
  static char *kwlist[] = {"query_start_loc", "num_tokens", "decode_threshold", "require_uniform", NULL};
  PyObject *qsl_o, *nt_o = Py_None;
  int threshold = 1, uniform = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O|Oip:split_decodes_and_prefills", kwlist, &qsl_o, &nt_o, &threshold,
                                   &uniform))
    return NULL;
  array a;
  if (uattn_py_array_index(&a, qsl_o, "query_start_loc", 1)) {
    uattn_py_array_release(&a);
    return NULL;
  }
  PyObject *r = NULL;
  if (a.shape[0] < 1) {
    uattn_py_fail_arg(&a, "expected num_reqs + 1 >= 1 entries, got 0");
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
    uattn_py_raise_status(st);
  else
    r = Py_BuildValue("(iiii)", s.num_decodes, s.num_prefills, s.num_decode_tokens, s.num_prefill_tokens);
done:
  uattn_py_array_release(&a);
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
    if (uattn_py_array_index(&a[i], objs[i], names[i], 1) || uattn_py_array_shape(&a[i], 1, want)) goto done;
    want[0] = a[i].shape[0];
  }
  int32_t R = (int32_t)want[0], ns = 0;
  void *op;
  order = uattn_py_new_numpy_str(1, want, "int32", &op);
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
    uattn_py_raise_status(st);
    goto done;
  }
  swaps = PyList_New(ns);
  for (int32_t i = 0; swaps && i < ns; i++) PyList_SET_ITEM(swaps, i, Py_BuildValue("(ii)", sw[i].a, sw[i].b));
  if (swaps) r = PyTuple_Pack(2, swaps, order);
done:
  for (int i = 0; i < narr; i++) uattn_py_array_release(&a[i]);
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
  if (bt_o != Py_None && uattn_py_array_index(&a, bt_o, "block_table", 1)) goto done;
  Py_ssize_t cap = seq_len > 0 ? seq_len : 0;
  void *p;
  if (!(out = uattn_py_new_numpy_str(1, &cap, "int64", &p))) goto done;
  int32_t n = 0;
  uattn_status st = uattn_compute_slot_mapping(profile, seq_len, context_len, start_idx, bs, a.data,
                                               (int32_t)(a.data ? a.shape[0] : 0), p, (int32_t)cap, &n);
  if (st != UATTN_OK)
    uattn_py_raise_status(st);
  else
    r = PySequence_GetSlice(out, 0, n);
done:
  uattn_py_array_release(&a);
  Py_XDECREF(out);
  return r;
}

/* ---- the functions (module.c adds them to the module) ----------------------------------------- */

PyMethodDef uattn_py_vllm_methods[] = {
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
