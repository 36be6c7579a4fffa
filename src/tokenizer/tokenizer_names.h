/* src/tokenizer's helpers (declared in tokenizer_impl.h) are shared between its files, so
 * they cannot be static; the library exports only kiln_ names, so each is
 * linked as kiln_<name> while the source keeps the short name. A new helper
 * gets its line here (tests/test_symbols fails until it has one). */
#ifndef KILN_TOKENIZER_NAMES_H
#define KILN_TOKENIZER_NAMES_H
#define kd_added_any_space kiln_kd_added_any_space
#define kd_added_build kiln_kd_added_build
#define kd_added_free kiln_kd_added_free
#define kd_added_has kiln_kd_added_has
#define kd_added_split kiln_kd_added_split
#define kd_buf_free kiln_kd_buf_free
#define kd_buf_put kiln_kd_buf_put
#define kd_buf_reserve kiln_kd_buf_reserve
#define kd_byte_to_unicode kiln_kd_byte_to_unicode
#define kd_chunk_boundary kiln_kd_chunk_boundary
#define kd_dec_bytelevel kiln_kd_dec_bytelevel
#define kd_dec_free kiln_kd_dec_free
#define kd_dec_parse kiln_kd_dec_parse
#define kd_events_push kiln_kd_events_push
#define kd_is_numeric kiln_kd_is_numeric
#define kd_is_whitespace kiln_kd_is_whitespace
#define kd_json_bool kiln_kd_json_bool
#define kd_json_keys kiln_kd_json_keys
#define kd_json_str kiln_kd_json_str
#define kd_map64_free kiln_kd_map64_free
#define kd_map64_get kiln_kd_map64_get
#define kd_map64_init kiln_kd_map64_init
#define kd_map64_put kiln_kd_map64_put
#define kd_norm_apply kiln_kd_norm_apply
#define kd_norm_chunk_safe kiln_kd_norm_chunk_safe
#define kd_norm_free kiln_kd_norm_free
#define kd_norm_parse kiln_kd_norm_parse
#define kd_pattern_find kiln_kd_pattern_find
#define kd_pattern_free kiln_kd_pattern_free
#define kd_pattern_parse kiln_kd_pattern_parse
#define kd_pattern_regex kiln_kd_pattern_regex
#define kd_post_apply kiln_kd_post_apply
#define kd_post_free kiln_kd_post_free
#define kd_post_parse kiln_kd_post_parse
#define kd_pretok_apply kiln_kd_pretok_apply
#define kd_pretok_byte_level kiln_kd_pretok_byte_level
#define kd_pretok_bytelevel kiln_kd_pretok_bytelevel
#define kd_pretok_chunk_safe kiln_kd_pretok_chunk_safe
#define kd_pretok_free kiln_kd_pretok_free
#define kd_pretok_parse kiln_kd_pretok_parse
#define kd_spans_free kiln_kd_spans_free
#define kd_spans_push kiln_kd_spans_push
#define kd_strmap_free kiln_kd_strmap_free
#define kd_strmap_get kiln_kd_strmap_get
#define kd_strmap_init kiln_kd_strmap_init
#define kd_strmap_put kiln_kd_strmap_put
#define kd_tok_add_merge kiln_kd_tok_add_merge
#define kd_tok_add_merge_rank kiln_kd_tok_add_merge_rank
#define kd_tok_finish kiln_kd_tok_finish
#define kd_tok_new kiln_kd_tok_new
#define kd_tok_new_base kiln_kd_tok_new_base
#define kd_tok_set kiln_kd_tok_set
#define kd_tok_vocab_get kiln_kd_tok_vocab_get
#define kd_tok_vocab_put kiln_kd_tok_vocab_put
#define kd_tok_words kiln_kd_tok_words
#define kd_unsupported kiln_kd_unsupported
#define kd_utf8_lossy kiln_kd_utf8_lossy
#define kd_utf8_next kiln_kd_utf8_next
#define kd_utf8_put kiln_kd_utf8_put
#define kd_work_free kiln_kd_work_free
#define kd_work_init kiln_kd_work_init
#endif
