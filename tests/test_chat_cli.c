/* `kiln tokenize` finds the chat template beside --tokenizer as transformers'
 * AutoTokenizer does (issue 22, item 14): tokenizer_config.json's
 * chat_template, chat_template.jinja winning over it, a line saying which
 * was used; without any template a "messages" line still fails clearly.
 * Runs the kiln binary built beside this test. */
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli_run.h"
#include "test.h"

static char dir[256];

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) fputs(text, f), fclose(f);
    CHECK(f != NULL, "cannot write %s", path);
}

/* DIR[/sub]/name, in one of 16 buffers used in turn */
static char *path_in(const char *sub, const char *name) {
    static char buf[16][600];
    static int k;
    char *p = buf[k++ % 16];
    snprintf(p, sizeof buf[0], "%s%s%s/%s", dir, sub[0] ? "/" : "", sub, name);
    return p;
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/kiln_test_chat_cli_XXXXXX");
    if (!cli_init(dir) || !mkdtemp(dir)) return 1;
    char sub[700];
    snprintf(sub, sizeof sub, "%s/model", dir);
    mkdir(sub, 0755);
    /* a small byte-level tokenizer, trained by kiln */
    write_text(path_in("", "corpus.txt"), "the user said hello and the assistant said hi there.\n\nhello hello hi\n");
    char tok[600], jsonl[600], out[600];
    snprintf(tok, sizeof tok, "%s", path_in("model", "tokenizer.json"));
    CHECK(cli_kiln_run((const char *[]){"tokenizer", "train", path_in("", "corpus.txt"), "--vocab-size", "300", "-o", tok, NULL}) == 0,
          "tokenizer train");
    write_text(path_in("", "chat.jsonl"),
               "{\"messages\": [{\"role\": \"user\", \"content\": \"hello\"}, {\"role\": \"assistant\", \"content\": \"hi there\"}]}\n"
               "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": \"hello\"}]}\n");
    snprintf(jsonl, sizeof jsonl, "%s", path_in("", "chat.jsonl"));
    snprintf(out, sizeof out, "%s", path_in("", "shards"));
    char tmpl_out[700];
    snprintf(tmpl_out, sizeof tmpl_out, "%s/chat_template.jinja", out);

    /* no template anywhere: the messages line fails, saying what it needs */
    int rc = cli_kiln_run((const char *[]){"tokenize", jsonl, "--tokenizer", tok, "-o", out, "--val-frac", "0", NULL});
    CHECK(rc == 1 && cli_output_has("chat.jsonl:1: a \"messages\" line needs a chat template"),
          "without a template: exit %d", rc);

    /* tokenizer_config.json beside the tokenizer: its chat_template */
    write_text(path_in("model", "tokenizer_config.json"),
               "{\"bos_token\": \"<|bos|>\", \"eos_token\": \"<|eos|>\", \"chat_template\": "
               "\"{% for m in messages %}<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}\"}");
    rc = cli_kiln_run((const char *[]){"tokenize", jsonl, "--tokenizer", tok, "-o", out, "--val-frac", "0", NULL});
    char want[800];
    snprintf(want, sizeof want, "kiln tokenize: chat template: %s (beside --tokenizer", path_in("model", "tokenizer_config.json"));
    CHECK(rc == 0 && cli_output_has(want) && cli_output_has("2 docs"), "tokenizer_config.json beside: exit %d", rc);
    char *text = NULL;
    size_t n = 0;
    CHECK(kiln_read_file(tmpl_out, &text, &n) == KILN_OK && text && strstr(text, "<{{ m.role }}>"),
          "the template used is recorded beside the shards");
    free(text);

    /* chat_template.jinja beside it wins over tokenizer_config.json's */
    write_text(path_in("model", "chat_template.jinja"), "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}");
    rc = cli_kiln_run((const char *[]){"tokenize", jsonl, "--tokenizer", tok, "-o", out, "--val-frac", "0", NULL});
    snprintf(want, sizeof want, "kiln tokenize: chat template: %s (beside --tokenizer", path_in("model", "chat_template.jinja"));
    CHECK(rc == 0 && cli_output_has(want), "chat_template.jinja beside: exit %d", rc);
    text = NULL;
    CHECK(kiln_read_file(tmpl_out, &text, &n) == KILN_OK && text && strstr(text, "[{{ m.role }}]"),
          "chat_template.jinja is the template recorded");
    free(text);

    /* --chat-template still chooses, and no line about a template beside */
    write_text(path_in("", "mine.jinja"), "{% for m in messages %}{{ m.content }}|{% endfor %}");
    rc = cli_kiln_run((const char *[]){"tokenize", jsonl, "--tokenizer", tok, "-o", out, "--val-frac", "0", "--chat-template",
                                       path_in("", "mine.jinja"), NULL});
    char *all = cli_output();
    CHECK(rc == 0 && !strstr(all, "beside --tokenizer"), "--chat-template: exit %d: %s", rc, all);
    free(all);

    /* a template beside the tokenizer that kiln cannot parse does not stop
     * plain text: one line says why it is not used */
    write_text(path_in("model", "chat_template.jinja"), "{% include 'x' %}");
    write_text(path_in("", "plain.txt"), "hello there\n\nhi\n");
    rc = cli_kiln_run((const char *[]){"tokenize", path_in("", "plain.txt"), "--tokenizer", tok, "-o", out, "--val-frac", "0", NULL});
    CHECK(rc == 0 && cli_output_has("not using the chat template beside the tokenizer") && cli_output_has("include"),
          "an unusable template beside, plain text: exit %d", rc);

    CHECK(t_rmtree(dir) == 0, "cleanup");
    TEST_END();
}
