/* Dockerfile parser (dockerfile.h): logical lines (backslash continuations, comments),
 * one instruction each, the subset cove runs. Pure code, fuzzed (tests/fuzz/fuzz_dockerfile.c). */
#include "control/dockerfile.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define ARGS_MAX 256

static const char *const supported =
    "FROM, RUN, COPY, ADD, ENV, ARG, WORKDIR, USER, EXPOSE, CMD, ENTRYPOINT";

static int bad(struct cove_err *err, int line, const char *fmt, const char *a)
{
        char msg[300];
        snprintf(msg, sizeof msg, fmt, a ? a : "");
        return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "Dockerfile line %d: %s", line, msg);
}

/* Words split on blanks; "double quoted" words keep their blanks (no escapes). */
static int words(const char *s, json_t *out, int line, struct cove_err *err)
{
        while (*s) {
                while (*s == ' ' || *s == '\t')
                        s++;
                if (!*s)
                        break;
                char w[4096];
                size_t o = 0;
                int q = 0; /* inside "…": blanks belong to the word */
                while (*s && (q || (*s != ' ' && *s != '\t')) && o < sizeof w - 1) {
                        if (*s == '"')
                                q = !q;
                        else
                                w[o++] = *s;
                        s++;
                }
                if (q)
                        return bad(err, line, "unterminated quote%s", NULL);
                if (o == sizeof w - 1)
                        return bad(err, line, "a word is too long%s", NULL);
                w[o] = '\0';
                if (json_array_size(out) >= ARGS_MAX)
                        return bad(err, line, "too many arguments%s", NULL);
                json_array_append_new(out, json_string(w));
        }
        return 0;
}

/* ["a", "b"]: the exec form; 1 when s is one, 0 when it is not JSON, -1 when it is bad. */
static int exec_form(const char *s, json_t *out, int line, struct cove_err *err)
{
        if (*s != '[')
                return 0;
        json_error_t je;
        json_t *a = json_loads(s, 0, &je);
        if (!json_is_array(a)) {
                json_decref(a);
                return 0; /* Docker runs it as a shell command then; so do we */
        }
        size_t i;
        json_t *v;
        int rc = 1;
        if (json_array_size(a) == 0 || json_array_size(a) > ARGS_MAX)
                rc = bad(err, line, "an exec form needs 1 to 256 strings%s", NULL);
        json_array_foreach(a, i, v)
        {
                if (rc == 1 &&
                    (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)))
                        rc = bad(err, line, "an exec form holds strings only%s", NULL);
        }
        if (rc == 1)
                json_array_extend(out, a);
        json_decref(a);
        return rc;
}

static int no_vars(const char *s, int line, const char *op, struct cove_err *err)
{
        if (strchr(s, '$'))
                return bad(err, line,
                           "%s: variable substitution is not supported here (RUN commands "
                           "see ENV and ARG values in their environment)",
                           op);
        return 0;
}

static int instruction(const char *kw, const char *rest, int line, int nsteps, json_t *steps,
                       struct cove_err *err)
{
        static const char *const ops[] = {"FROM",    "RUN",  "COPY",   "ADD", "ENV",       "ARG",
                                          "WORKDIR", "USER", "EXPOSE", "CMD", "ENTRYPOINT"};
        const char *op = NULL;
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
                if (!strcasecmp(kw, ops[i]))
                        op = ops[i];
        if (!op) {
                static const char *const known[] = {"MAINTAINER", "LABEL",      "VOLUME",
                                                    "ONBUILD",    "STOPSIGNAL", "HEALTHCHECK",
                                                    "SHELL"};
                for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
                        if (!strcasecmp(kw, known[i])) {
                                char m[200];
                                snprintf(m, sizeof m, "%s is not supported (supported: %s)",
                                         known[i], supported);
                                return bad(err, line, "%s", m);
                        }
                char k[40];
                snprintf(k, sizeof k, "%.32s", kw);
                return bad(err, line, "unknown instruction %s", k);
        }
        if (nsteps == 0 && strcmp(op, "FROM"))
                return bad(err, line, "the first instruction must be FROM, not %s", op);
        if (nsteps > 0 && !strcmp(op, "FROM"))
                return bad(err, line, "a second FROM: multi-stage builds are not supported%s",
                           NULL);
        int add = !strcmp(op, "ADD"); /* COPY that unpacks local archives */
        if (add)
                op = "COPY";
        json_t *args = json_array();
        int shell = 0, rc = 0;
        if (!strcmp(op, "RUN") || !strcmp(op, "CMD") || !strcmp(op, "ENTRYPOINT")) {
                if (!strncmp(rest, "--", 2))
                        rc = bad(err, line, "%s flags (--mount, --network…) are not supported", op);
                else if ((rc = exec_form(rest, args, line, err)) == 0) {
                        if (!*rest && strcmp(op, "RUN") == 0)
                                rc = bad(err, line, "RUN needs a command%s", NULL);
                        else {
                                json_array_append_new(args, json_string(rest));
                                shell = 1;
                        }
                }
                rc = rc < 0 ? -1 : 0;
        } else if (!strcmp(op, "COPY")) {
                if (!strncmp(rest, "--", 2))
                        rc = bad(err, line,
                                 "COPY/ADD flags (--chown, --from…) are not "
                                 "supported%s",
                                 NULL);
                else if (no_vars(rest, line, op, err) < 0)
                        rc = -1;
                else {
                        int f = exec_form(rest, args, line, err);
                        if (f == 0)
                                f = words(rest, args, line, err) < 0 ? -1 : 1;
                        if (f < 0)
                                rc = -1;
                        else if (json_array_size(args) < 2)
                                rc =
                                    bad(err, line, "COPY needs a source and a destination%s", NULL);
                        size_t i;
                        json_t *v;
                        json_array_foreach(args, i, v)
                        {
                                const char *a = json_string_value(v);
                                if (rc == 0 && strstr(a, "://"))
                                        rc = bad(err, line,
                                                 "ADD of a URL is not supported "
                                                 "(no downloads at build time)%s",
                                                 NULL);
                        }
                }
        } else if (!strcmp(op, "ENV")) {
                if (no_vars(rest, line, op, err) < 0) {
                        rc = -1;
                } else if (!strchr(rest, '=')) { /* legacy "ENV NAME value with blanks" */
                        const char *sp = rest + strcspn(rest, " \t");
                        if (sp == rest || !*sp)
                                rc = bad(err, line, "ENV needs NAME=VALUE%s", NULL);
                        else {
                                json_array_append_new(args,
                                                      json_stringn(rest, (size_t)(sp - rest)));
                                while (*sp == ' ' || *sp == '\t')
                                        sp++;
                                json_array_append_new(args, json_string(sp));
                        }
                } else {
                        json_t *w = json_array();
                        rc = words(rest, w, line, err);
                        size_t i;
                        json_t *v;
                        json_array_foreach(w, i, v)
                        {
                                const char *s = json_string_value(v), *eq = strchr(s, '=');
                                if (rc == 0 && (!eq || eq == s))
                                        rc = bad(err, line, "ENV needs NAME=VALUE pairs%s", NULL);
                                if (rc == 0) {
                                        json_array_append_new(args,
                                                              json_stringn(s, (size_t)(eq - s)));
                                        json_array_append_new(args, json_string(eq + 1));
                                }
                        }
                        json_decref(w);
                }
        } else if (!strcmp(op, "ARG")) {
                rc = words(rest, args, line, err);
                if (rc == 0 && json_array_size(args) != 1)
                        rc = bad(err, line, "ARG takes one NAME[=default]%s", NULL);
        } else if (!strcmp(op, "FROM")) {
                rc = words(rest, args, line, err);
                if (rc == 0 && json_array_size(args) != 1)
                        rc = bad(err, line,
                                 "FROM takes one template or image name (AS and --platform are "
                                 "not supported)%s",
                                 NULL);
                if (rc == 0)
                        rc = no_vars(rest, line, op, err);
        } else { /* WORKDIR USER EXPOSE */
                rc = no_vars(rest, line, op, err);
                if (rc == 0)
                        rc = words(rest, args, line, err);
                if (rc == 0 && (json_array_size(args) == 0 ||
                                (strcmp(op, "EXPOSE") && json_array_size(args) != 1)))
                        rc = bad(err, line, "%s takes one value", op);
                if (rc == 0 && !strcmp(op, "WORKDIR") &&
                    json_string_value(json_array_get(args, 0))[0] != '/')
                        rc = bad(err, line, "WORKDIR must be an absolute path%s", NULL);
        }
        if (rc < 0) {
                json_decref(args);
                return -1;
        }
        json_t *st =
            json_pack("{s:i, s:s, s:o, s:b}", "line", line, "op", op, "args", args, "shell", shell);
        if (st && add) /* only then: COPY's cache keys stay what they were */
                json_object_set_new(st, "add", json_true());
        json_array_append_new(steps, st);
        return 0;
}

int cove_dockerfile_parse(const char *text, size_t len, json_t **steps, struct cove_err *err)
{
        *steps = NULL;
        if (len > COVE_DOCKERFILE_MAX)
                return cove_err_setk(err, COVE_E_LIMIT, 0, "Dockerfile larger than %d bytes",
                                     COVE_DOCKERFILE_MAX);
        if (memchr(text, '\0', len))
                return cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "Dockerfile holds a NUL byte");
        json_t *out = json_array();
        char *logical = malloc(COVE_DOCKERFILE_MAX + 1);
        if (!out || !logical) {
                json_decref(out);
                free(logical);
                return cove_err_set(err, ENOMEM, "Dockerfile");
        }
        size_t ll = 0, pos = 0;
        int line = 0, start = 0, rc = 0;
        while (rc == 0 && pos < len) {
                const char *s = text + pos;
                const char *nl = memchr(s, '\n', len - pos);
                size_t n = nl ? (size_t)(nl - s) : len - pos;
                pos += n + (nl ? 1 : 0);
                line++;
                while (n && (s[n - 1] == '\r' || s[n - 1] == ' ' || s[n - 1] == '\t'))
                        n--;
                size_t b = 0;
                while (b < n && (s[b] == ' ' || s[b] == '\t'))
                        b++;
                if (b < n && s[b] == '#')
                        continue; /* comments (and parser directives), also inside a
                                   * continued instruction */
                if (b == n && ll == 0)
                        continue;
                if (ll == 0)
                        start = line;
                int cont = n > b && s[n - 1] == '\\';
                size_t take = n - b - (cont ? 1 : 0);
                if (ll + take + 1 > COVE_DOCKERFILE_MAX) {
                        rc = cove_err_setk(err, COVE_E_LIMIT, 0, "Dockerfile too long");
                        break;
                }
                if (ll && take)
                        logical[ll++] = ' ';
                memcpy(logical + ll, s + b, take);
                ll += take;
                if (cont && pos < len)
                        continue;
                logical[ll] = '\0';
                ll = 0;
                char *p = logical;
                while (*p == ' ' || *p == '\t')
                        p++;
                if (!*p)
                        continue;
                char *kw = p;
                while (*p && *p != ' ' && *p != '\t')
                        p++;
                if (*p)
                        *p++ = '\0';
                while (*p == ' ' || *p == '\t')
                        p++;
                if (json_array_size(out) >= COVE_DOCKERFILE_STEPS_MAX)
                        rc = cove_err_setk(err, COVE_E_LIMIT, 0,
                                           "Dockerfile line %d: more than %d instructions", start,
                                           COVE_DOCKERFILE_STEPS_MAX);
                else
                        rc = instruction(kw, p, start, (int)json_array_size(out), out, err);
        }
        free(logical);
        if (rc == 0 && json_array_size(out) == 0)
                rc = cove_err_setk(err, COVE_E_BAD_REQUEST, 0, "the Dockerfile has no FROM");
        if (rc < 0) {
                json_decref(out);
                return -1;
        }
        *steps = out;
        return 0;
}
