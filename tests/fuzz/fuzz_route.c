/* libFuzzer target: request paths against the route table (the first thing the API does
 * with a URL), RFC 3339 query values, and request bodies through the JSON validation of sandbox
 * creation and exec. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "api/http.h"
#include "api/routes.h"
#include "util/util.h"

int cove_exec_request_build(json_t *body, const char *env_json, json_t **req, json_t **cmd,
                            char *why, size_t cap);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        char *s = malloc(size + 1);
        if (!s)
                return 0;
        memcpy(s, data, size);
        s[size] = '\0';
        /* query values the E2B list takes (startedAfter) */
        if (cove_rfc3339_parse(s) < -1)
                __builtin_trap();
        for (size_t i = 0; i < cove_nroutes; i++) {
                char *params[COVE_HTTP_MAX_PARAMS];
                int n;
                if (cove_route_match(cove_routes[i].pattern, s, params, &n))
                        for (int k = 0; k < n; k++)
                                free(params[k]);
        }
        json_error_t je;
        json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &je);
        if (json_is_object(body)) {
                json_t *req = NULL, *cmd = NULL;
                char why[256];
                if (cove_exec_request_build(body, "{\"A\":\"b\"}", &req, &cmd, why, sizeof(why)) ==
                    0) {
                        json_decref(req);
                        json_decref(cmd);
                }
        }
        json_decref(body);
        free(s);
        return 0;
}
