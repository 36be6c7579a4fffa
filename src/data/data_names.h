/* src/data's helpers (declared in data_impl.h) are shared between its files, so
 * they cannot be static; the library exports only kiln_ names, so each is
 * linked as kiln_<name> while the source keeps the short name. A new helper
 * gets its line here (tests/test_symbols fails until it has one). */
#ifndef KILN_DATA_NAMES_H
#define KILN_DATA_NAMES_H
#define kd_tokenize_add kiln_kd_tokenize_add
#define kd_tokenize_jsonl kiln_kd_tokenize_jsonl
#endif
