/* The XML answers of an S3 server (ListObjectsV2, Error, CopyObject), read by a small
 * bounded parser: the store is a remote party and its answers are untrusted input.
 *
 * The parser knows elements, attributes (skipped), text, the five predefined entities and
 * numeric character references, comments, processing instructions and CDATA. It refuses
 * DOCTYPE (no entity definitions, so no entity expansion attacks), nesting deeper than
 * COVE_XML_MAX_DEPTH, a text longer than COVE_XML_MAX_TEXT, mismatched or unclosed tags and
 * anything after the root element. It never allocates: the caller's buffer is the bound.
 * Errors: -1 + struct cove_err (kind INTERNAL, message "malformed XML: …"). */
#ifndef COVE_STORE_S3XML_H
#define COVE_STORE_S3XML_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#define COVE_XML_MAX_DEPTH 12
#define COVE_XML_MAX_TEXT 2048 /* decoded text of one element */
#define COVE_XML_MAX_PATH 256  /* "Root/Child/Leaf" of local names */

/* Called at each element's end tag with its path of local names (namespace prefixes
 * stripped, e.g. "ListBucketResult/Contents/Key") and the decoded text directly inside it
 * (NUL-terminated; text of mixed content is concatenated). Return <0 to stop: the walk
 * then returns -1 with whatever the callback put in err. */
typedef int (*cove_xml_cb)(const char *path, const char *text, size_t len, void *arg,
                           struct cove_err *err);
int cove_xml_walk(const char *buf, size_t len, cove_xml_cb cb, void *arg, struct cove_err *err);

/* A ListObjectsV2 page (root ListBucketResult). Each <Contents> is reported through cb with
 * its Key (raw, 1..1024 bytes: the caller validates it), Size and LastModified (ms since
 * the epoch, from ISO 8601 "YYYY-MM-DDTHH:MM:SS[.fff]Z"); an entry missing one of them is
 * an error. truncated/next_token come from IsTruncated and NextContinuationToken (a
 * truncated page without a token is an error). */
struct cove_s3_list_page {
        int truncated;
        char next_token[1025];
        size_t keys; /* entries reported */
};
typedef int (*cove_s3_entry_cb)(const char *key, uint64_t size, int64_t mtime_ms, void *arg,
                                struct cove_err *err);
int cove_s3_parse_list(const char *xml, size_t len, struct cove_s3_list_page *pg,
                       cove_s3_entry_cb cb, void *arg, struct cove_err *err);

/* An <Error> answer: its Code (printable ASCII only, else "?"; "" when absent). Returns 1
 * if the body is an Error document, 0 if it is well-formed XML of another root, -1 if it
 * is not well-formed. */
int cove_s3_parse_error(const char *xml, size_t len, char code[64], struct cove_err *err);

/* ISO 8601 UTC timestamp as S3 lists it → ms; -1 if malformed. */
int64_t cove_s3_parse_iso8601(const char *s);
/* RFC 7231 IMF-fixdate ("Tue, 01 Dec 2026 10:11:29 GMT") → ms; -1 if malformed. */
int64_t cove_s3_parse_http_date(const char *s);

#endif
