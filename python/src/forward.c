/*
 * uattn.forward (attention over the paged caches, in place), uattn.merge_states, and the kernel reports:
 * which kernels served or would serve a forward, and which buckets this build holds.
 */
#include <stdio.h>
#include <string.h>

#include "uattn_py.h"

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
  if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O!OOOOO|OOpOOO:forward", kwlist, &uattn_py_plan_type, &plan_o,
                                   &uattn_py_layer_type, &layer_o, &q_o, &k_o, &v_o, &kc_o, &vc_o, &rt_o, &out_o,
                                   &return_lse, &lse_o, &enc_o, &cbt_o))
    return NULL;
  PlanObject *plan = (PlanObject *)plan_o;
  const uattn_layer *L = &((LayerObject *)layer_o)->layer;
  RuntimeObject *rt = NULL;
  if (rt_o != Py_None) {
    if (!PyObject_TypeCheck(rt_o, &uattn_py_runtime_type)) {
      PyErr_Format(PyExc_TypeError, "runtime: expected a uattn.Runtime or None, got %s", Py_TYPE(rt_o)->tp_name);
      return NULL;
    }
    rt = (RuntimeObject *)rt_o;
    if (!rt->rt) {
      PyErr_SetString(PyExc_ValueError, "runtime: the runtime is closed");
      return NULL;
    }
  }
  if (uattn_py_plan_ready(plan)) return NULL;

  array a[A_N];
  memset(a, 0, sizeof a);
  PyObject *out = NULL, *lse = NULL, *result = NULL;
  int locked = 0;
  uattn_py_plan_acquire(plan);
  locked = 1;
  uattn_plan_info info;
  uattn_status st = uattn_plan_get_info(plan->plan, &info);
  if (st != UATTN_OK) {
    uattn_py_raise_status(st);
    goto done;
  }
  const Py_ssize_t T = info.num_tokens, Hq = L->num_q_heads, Hkv = L->num_kv_heads, D = L->head_dim;
  const Py_ssize_t Dv = L->head_dim_v ? L->head_dim_v : D;
  const Py_ssize_t bs = plan->cfg.block_size;
  enum kind alt, calt;
  const char *desc, *cdesc;
  enum kind want = kind_of_dtype(L->dtype, &alt, &desc);
  enum kind cwant = kind_of_dtype(L->cache_dtype, &calt, &cdesc);
  const Py_ssize_t qshape[3] = {T, Hq, D}, kshape[3] = {T, Hkv, D}, vshape[3] = {T, Hkv, Dv}, oshape[3] = {T, Hq, Dv};
  /* a kv_latent layer's values are its keys' first Dv dims: an array given for them would be ignored */
  if (L->kv_latent && (v_o != Py_None || vc_o != Py_None)) {
    PyErr_Format(PyExc_ValueError,
                 "%s: a kv_latent layer has no %s (each key's first head_dim_v dims are its value): pass None",
                 v_o != Py_None ? "v" : "value_cache", v_o != Py_None ? "values" : "value cache");
    goto done;
  }
  if (!L->kv_latent && (v_o == Py_None || vc_o == Py_None)) {
    PyErr_Format(PyExc_ValueError, "%s: None is only for a kv_latent layer (this layer has values)",
                 v_o == Py_None ? "v" : "value_cache");
    goto done;
  }
  if (uattn_py_array_get(&a[A_Q], q_o, "q", 0) || uattn_py_array_kind(&a[A_Q], want, alt, desc) ||
      uattn_py_array_shape(&a[A_Q], 3, qshape) || uattn_py_array_get(&a[A_K], k_o, "k", 0) ||
      uattn_py_array_kind(&a[A_K], want, alt, desc) || uattn_py_array_shape(&a[A_K], 3, kshape))
    goto done;
  if (!L->kv_latent && (uattn_py_array_get(&a[A_V], v_o, "v", 0) || uattn_py_array_kind(&a[A_V], want, alt, desc) ||
                        uattn_py_array_shape(&a[A_V], 3, vshape)))
    goto done;

  /* The caches: NHD as [num_blocks * block_size, Hkv, D] (uattn.h) or [num_blocks, block_size, Hkv, D]
   * (vLLM's), HND as [num_blocks, Hkv, block_size, D]; TILED as uattn.h's
   * [num_blocks, block_size / 16, Hkv, D / 2, 16, 2] keys and [num_blocks, block_size / 16, Hkv, 8, Dv, 2]
   * values. The value cache's rows are Dv long; a kv_latent layer has none. */
  Py_ssize_t num_blocks = -1;
  PyObject *cache_objs[2] = {kc_o, vc_o};
  const char *cache_names[2] = {"key_cache", "value_cache"};
  for (int c = 0; c < (L->kv_latent ? 1 : 2); c++) {
    array *ca = &a[A_KC + c];
    const Py_ssize_t W = c ? Dv : D; /* the cache's row length */
    if (uattn_py_array_get(ca, cache_objs[c], cache_names[c], 1) || uattn_py_array_kind(ca, cwant, calt, cdesc))
      goto done;
    Py_ssize_t nb = -1;
    if (L->kv_layout == UATTN_LAYOUT_TILED) {
      /* TILED's shapes exist only for these; the library refuses the others too, but the shape check below
       * would first name a shape that cannot be */
      if (bs % 16 || D % 2) {
        uattn_py_fail_arg(ca,
                          "kv_layout \"TILED\" needs a block_size that is a multiple of 16 and an even head_dim, got "
                          "%zd and %zd",
                          bs, D);
        goto done;
      }
      Py_ssize_t wk[6] = {num_blocks, bs / 16, Hkv, D / 2, 16, 2}, wv[6] = {num_blocks, bs / 16, Hkv, 8, Dv, 2};
      if (uattn_py_array_shape(ca, 6, c ? wv : wk)) goto done;
      nb = ca->shape[0];
    } else if (L->kv_layout == UATTN_LAYOUT_HND) {
      Py_ssize_t w[4] = {num_blocks, Hkv, bs, W};
      if (uattn_py_array_shape(ca, 4, w)) goto done;
      nb = ca->shape[0];
    } else if (ca->ndim == 4) {
      Py_ssize_t w[4] = {num_blocks, bs, Hkv, W};
      if (uattn_py_array_shape(ca, 4, w)) goto done;
      nb = ca->shape[0];
    } else {
      Py_ssize_t w[3] = {num_blocks < 0 ? -1 : num_blocks * bs, Hkv, W};
      if (uattn_py_array_shape(ca, 3, w)) goto done;
      if (ca->shape[0] % bs) {
        uattn_py_fail_arg(ca, "its %zd rows are not whole blocks of the plan's block_size %zd", ca->shape[0], bs);
        goto done;
      }
      nb = ca->shape[0] / bs;
    }
    if (nb > INT32_MAX) {
      uattn_py_fail_arg(ca, "more than 2^31-1 blocks");
      goto done;
    }
    num_blocks = nb;
  }
  if (!L->kv_latent && a[A_KC].data == a[A_VC].data && num_blocks > 0) {
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
    if (uattn_py_array_index(&a[A_ENC], enc_o, "encoder_lens", 1) || uattn_py_array_shape(&a[A_ENC], 1, w1) ||
        uattn_py_array_index(&a[A_CBT], cbt_o, "cross_block_table", 2) || uattn_py_array_shape(&a[A_CBT], 2, w2))
      goto done;
    cross.encoder_lens = a[A_ENC].data;
    cross.block_table = a[A_CBT].data;
    cross.block_table_stride = (int32_t)a[A_CBT].shape[1];
  }

  if (out_o != Py_None) {
    if (uattn_py_array_checked(&a[A_OUT], out_o, "out", 1, want, alt, desc, 3, oshape)) goto done;
    out = Py_NewRef(out_o);
  } else {
    out = new_like(q_o, &a[A_Q], 3, oshape, 0);
    if (!out && PyErr_Occurred()) goto done;
    if (!out) {
      void *p;
      out = uattn_py_new_numpy_str(3, oshape, numpy_dtype_name(L->dtype), &p);
      if (!out) goto done;
    }
    if (uattn_py_array_get(&a[A_OUT], out, "out", 1)) goto done;
  }
  const Py_ssize_t lshape[2] = {T, Hq};
  if (lse_o != Py_None) {
    if (uattn_py_array_f32(&a[A_LSE], lse_o, "lse", 1, 2, lshape)) goto done;
    lse = Py_NewRef(lse_o);
  } else if (return_lse) {
    lse = new_like(q_o, &a[A_Q], 2, lshape, 1);
    if (!lse && PyErr_Occurred()) goto done;
    if (!lse) {
      void *p;
      lse = uattn_py_new_numpy_str(2, lshape, "float32", &p);
      if (!lse) goto done;
    }
    if (uattn_py_array_get(&a[A_LSE], lse, "lse", 1)) goto done;
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
    uattn_py_raise_status(st);
    goto done;
  }
  if (lse && (return_lse || lse_o != Py_None))
    result = PyTuple_Pack(2, out, lse);
  else
    result = Py_NewRef(out);

done:
  for (int i = 0; i < A_N; i++) uattn_py_array_release(&a[i]);
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
    if (uattn_py_array_f32(a, given, name, 1, ndim, shape)) return -1;
    *obj = Py_NewRef(given);
    return 0;
  }
  void *p;
  if (!(*obj = uattn_py_new_numpy_str(ndim, shape, "float32", &p))) return -1;
  return uattn_py_array_get(a, *obj, name, 1);
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
    if (uattn_py_array_f32(&a[2 * i], PySequence_Fast_ITEMS(outs)[i], names[2 * i], 0, 3, oshape)) goto done;
    for (int d = 0; d < 3; d++) oshape[d] = a[0].shape[d];
    lshape[0] = oshape[0], lshape[1] = oshape[1];
    if (uattn_py_array_f32(&a[2 * i + 1], PySequence_Fast_ITEMS(lses)[i], names[2 * i + 1], 0, 2, lshape)) goto done;
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
  Py_END_ALLOW_THREADS if (st != UATTN_OK) uattn_py_raise_status(st);
  else result = PyTuple_Pack(2, out, lse);
done:
  if (a)
    for (Py_ssize_t i = 0; i < 2 * n + 2; i++) uattn_py_array_release(&a[i]);
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
    rc |= uattn_py_set_item(pk, parts[i], PyUnicode_FromString(r->part_kernel[i]));
    rc |= uattn_py_set_item(pc, parts[i], PyLong_FromLongLong(r->part_calls[i]));
    rc |= uattn_py_set_item(dc, parts[i], PyLong_FromLongLong(r->decode_calls[i]));
  }
  if (rc) {
    Py_XDECREF(pk);
    Py_XDECREF(pc);
    Py_XDECREF(dc);
    return NULL;
  }
  return Py_BuildValue("{s:i,s:i,s:s,s:i,s:O,s:s,s:N,s:s,s:O,s:s,s:N,s:N,s:n,s:i}", "block_size", r->block_size,
                       "head_dim", r->head_dim, "cache_dtype", uattn_py_dtype_str(r->cache_dtype), "chunk_size",
                       r->chunk_size, "bucket_hit", r->bucket_hit ? Py_True : Py_False, "kernel_set",
                       r->kernel_set ? r->kernel_set : "", "part_kernel", pk, "decode_kernel", r->decode_kernel,
                       "panels_gathered", r->panels_gathered ? Py_True : Py_False, "reason", r->reason, "part_calls",
                       pc, "decode_calls", dc, "workspace_bytes", (Py_ssize_t)r->workspace_bytes, "workers",
                       r->workers);
}

static PyObject *py_last_forward_report(PyObject *mod, PyObject *unused) {
  uattn_kernel_report r;
  uattn_status st = uattn_last_forward_report(&r);
  if (st != UATTN_OK) return uattn_py_raise_status(st);
  return report_dict(&r);
}

static PyObject *py_describe_kernels(PyObject *mod, PyObject *args) {
  PyObject *layer;
  int bs;
  if (!PyArg_ParseTuple(args, "O!i:describe_kernels", &uattn_py_layer_type, &layer, &bs)) return NULL;
  uattn_kernel_report r;
  uattn_status st = uattn_describe_kernels(&((LayerObject *)layer)->layer, bs, &r);
  if (st != UATTN_OK) return uattn_py_raise_status(st);
  return report_dict(&r);
}

static PyObject *py_kernel_buckets(PyObject *mod, PyObject *unused) {
  int32_t n = uattn_kernel_buckets(NULL, 0);
  uattn_kernel_bucket *b = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof *b);
  if (!b) return PyErr_NoMemory();
  n = uattn_kernel_buckets(b, n);
  PyObject *list = PyList_New(n);
  for (int32_t i = 0; list && i < n; i++) {
    PyObject *d = Py_BuildValue("{s:s,s:i,s:i,s:i,s:s,s:O}", "dtype", uattn_py_dtype_str(b[i].dtype), "block_size",
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

/* ---- the functions (module.c adds them to the module) ----------------------------------------- */

PyMethodDef uattn_py_forward_methods[] = {
    {"forward", (PyCFunction)(void (*)(void))py_forward, METH_VARARGS | METH_KEYWORDS,
     "forward(plan, layer, q, k, v, key_cache, value_cache, runtime=None, out=None, return_lse=False,\n"
     "        lse=None, encoder_lens=None, cross_block_table=None) -> out | (out, lse)\n\n"
     "Writes this step's k/v into the caches (in place) and computes attention for every query row of the\n"
     "plan's last step. q [T, Hq, D], k [T, Hkv, D], v [T, Hkv, Dv] in layer.dtype (bf16: uint16 bits or a\n"
     "bfloat16 tensor; Dv = layer.head_dim_v); caches in layer.cache_dtype, key rows D long and value rows Dv:\n"
     "NHD [num_blocks * block_size, Hkv, D] or [num_blocks, block_size, Hkv, D], HND\n"
     "[num_blocks, Hkv, block_size, D], TILED keys [num_blocks, block_size / 16, Hkv, D / 2, 16, 2] and values\n"
     "[num_blocks, block_size / 16, Hkv, 8, Dv, 2] (uattn.h). A kv_latent layer takes v=None and\n"
     "value_cache=None. out [T, Hq, Dv] is made in the kind of q unless given; lse [T, Hq] float32. The GIL is\n"
     "released while it runs."},
    {"merge_states", (PyCFunction)(void (*)(void))py_merge_states, METH_VARARGS | METH_KEYWORDS,
     "merge_states(outs, lses, out=None, lse=None) -> (out, lse)\n\n"
     "Merges attention results over disjoint key sets: float32 outs [rows, heads, D], lses [rows, heads]."},
    {"last_forward_report", py_last_forward_report, METH_NOARGS,
     "What served this thread's last forward: kernels per part, why, calls, scratch, workers (a dict)."},
    {"describe_kernels", py_describe_kernels, METH_VARARGS,
     "describe_kernels(layer, block_size): which kernels a forward of this layer would run."},
    {"kernel_buckets", py_kernel_buckets, METH_NOARGS, "The kernel buckets generated into this build (dicts)."},
    {"kernel_set", py_kernel_set, METH_NOARGS, "(name, why): the generic kernel set this CPU runs."},
    {NULL}};
