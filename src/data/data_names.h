/* src/data's helpers (declared in data_impl.h) are shared between its files, so
 * they cannot be static; the library exports only kiln_ names, so each is
 * linked as kiln_<name> while the source keeps the short name. A new helper
 * gets its line here (tests/test_symbols fails until it has one). */
#ifndef KILN_DATA_NAMES_H
#define KILN_DATA_NAMES_H
#define kd_tokenize_add kiln_kd_tokenize_add
#define kd_tokenize_jsonl kiln_kd_tokenize_jsonl
#define kd_tokenize_kind kiln_kd_tokenize_kind
#define kd_tokenize_add_pair kiln_kd_tokenize_add_pair
#define kd_pair_line kiln_kd_pair_line
#define kd_pair_build kiln_kd_pair_build
#define kd_pair_encode kiln_kd_pair_encode
#define kd_pair_add kiln_kd_pair_add
#define kd_pair_free kiln_kd_pair_free
#endif
