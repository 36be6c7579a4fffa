/* The error API: a message with context added to it, the context formatted
 * from the current message itself, and a message that does not fit. */
#include "test.h"

int main(void) {
    kiln_error(KILN_ERR_INVALID, "unknown compile mode '%s'", "bogus");
    kiln_error_context(KILN_ERR_INVALID, "compile");
    CHECK(!strcmp(kiln_last_error(), "compile: unknown compile mode 'bogus'"), "context prefix: %s", kiln_last_error());
    CHECK(kiln_last_status() == KILN_ERR_INVALID, "status kept");
    /* formatting the current message into the next one (overlapping
     * vsnprintf before the fix: "compile: compile: ompile ...") */
    kiln_error(KILN_ERR_IO, "unknown compile mode '%s'", "bogus");
    kiln_error(KILN_ERR_INVALID, "compile: %s", kiln_last_error());
    CHECK(!strcmp(kiln_last_error(), "compile: unknown compile mode 'bogus'"), "own message as argument: %s",
          kiln_last_error());
    kiln_error(KILN_ERR_IO, "abc");
    kiln_error_context(KILN_ERR_IO, "%s and %s", kiln_last_error(), kiln_last_error());
    CHECK(!strcmp(kiln_last_error(), "abc and abc: abc"), "context from the message: %s", kiln_last_error());
    /* a long message is cut, never overflows */
    char big[3000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    kiln_error(KILN_ERR_IO, "%s", big);
    kiln_error_context(KILN_ERR_IO, "%s", big);
    CHECK(strlen(kiln_last_error()) < 1024 && !strncmp(kiln_last_error(), "xxx", 3), "long messages are truncated");
    kiln_clear_error();
    CHECK(kiln_last_status() == KILN_OK && !strcmp(kiln_last_error(), "no error"), "cleared");
    TEST_END();
}
