/* Shared by the graph files. */
#ifndef KILN_GRAPH_INTERNAL_H
#define KILN_GRAPH_INTERNAL_H
#include "kiln/graph.h"

/* Appends a value; returns its id or -1 (error set). */
int kiln_graph_add(kiln_graph *g, kiln_value v);
/* Inserts v at position pos, renumbering every later value and every
 * reference to them; returns pos or -1 (error set). */
int kiln_graph_insert(kiln_graph *g, int pos, kiln_value v);
/* Replaces every use of `from` by `to` in values after `from` and in outputs. */
void kiln_graph_replace_uses(kiln_graph *g, int from, int to);
/* Follows aliases to the value owning the buffer. */
int kiln_graph_root(const kiln_graph *g, int v);
/* Counts live readers of every value into n_uses. */
void kiln_graph_count_uses(kiln_graph *g);
/* The single live reader of v, or -1. */
int kiln_graph_only_user(const kiln_graph *g, int v);
/* Can the fusion pass (fuse.c) put value v in an element-wise group: an op
 * with a C expression over f32 values of its own size (or scalars), with
 * an f32 result or a bf16 cast? */
bool kiln_fusable(const kiln_graph *g, int v);

/* Tracing (trace.c): runs fn with a recording dispatcher into a new graph
 * (params, inputs, the forward; outputs and diff set); the tracer keeps a
 * symbolic tensor for every value, for autograd, whose backward rules run
 * as ops too. kiln_trace_backward binds the values passes added since, then
 * appends the backward of g->diff. */
typedef struct kiln_tracer kiln_tracer;
kiln_status kiln_trace(kiln_trace_fn fn, void *user, kiln_tensor **params, int n_params, kiln_tensor *const *example,
                       int n_inputs, bool backward, kiln_graph **g, kiln_tracer **t);
kiln_status kiln_trace_backward(kiln_tracer *t);
void kiln_tracer_free(kiln_tracer *t);
#endif
