/* The Jinja subset's helpers (jn_/jb_/jl_, declared in jinja_impl.h) are shared between its files, so
 * they cannot be static; the library exports only kiln_ names, so each is
 * linked as kiln_<name> while the source keeps the short name. A new helper
 * gets its line here (tests/test_symbols fails until it has one). */
#ifndef KILN_TEMPLATE_NAMES_H
#define KILN_TEMPLATE_NAMES_H
#define jb_put kiln_jb_put
#define jb_putc kiln_jb_putc
#define jl_arg kiln_jl_arg
#define jl_args_check kiln_jl_args_check
#define jl_equal kiln_jl_equal
#define jl_cur_budget kiln_jl_cur_budget
#define jl_filter kiln_jl_filter
#define jl_filter_find kiln_jl_filter_find
#define jl_getitem kiln_jl_getitem
#define jl_is_method kiln_jl_is_method
#define jl_iter_list kiln_jl_iter_list
#define jl_less kiln_jl_less
#define jl_lex kiln_jl_lex
#define jl_lex_error kiln_jl_lex_error
#define jl_method kiln_jl_method
#define jl_repr kiln_jl_repr
#define jl_rerr kiln_jl_rerr
#define jl_space_at kiln_jl_space_at
#define jl_str kiln_jl_str
#define jl_string kiln_jl_string
#define jl_strip kiln_jl_strip
#define jl_test kiln_jl_test
#define jl_test_find kiln_jl_test_find
#define jl_tojson kiln_jl_tojson
#define jl_truthy kiln_jl_truthy
#define jl_utf8_len kiln_jl_utf8_len
#define jl_utf8_off kiln_jl_utf8_off
#define jn_add kiln_jn_add
#define jn_free kiln_jn_free
#define jn_new kiln_jn_new
#endif
