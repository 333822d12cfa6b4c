/* A template's start and ready commands, run in each new sandbox of it (control/tbuild.h):
 * start_cmd as a listed process tagged "start", then ready_cmd until it exits 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "control/coved.h"
#include "control/tbuild.h"
#include "node/chan.h"
#include "util/util.h"

#define READY_EVERY_MS 200
#define READY_TRY_MAX_S 10 /* one attempt's own bound (the guest kills it past that) */
#define TAIL_MAX 200

/* The guest exec request for a shell command with the sandbox's env and the template's
 * user and workdir (as an exec of the API would get them by default). */
static json_t *shell_req(const struct cove_sandbox_row *s, json_t *run, const char *cmd,
                         int timeout_s)
{
        json_t *req = json_pack("{s:s, s:s, s:b}", "op", "exec", "shell", cmd, "stdin", 0);
        json_error_t je;
        json_t *env = json_loads(s->env_json ? s->env_json : "{}", 0, &je);
        json_object_set_new(req, "env", json_is_object(env) ? env : json_object());
        if (env && !json_is_object(env))
                json_decref(env);
        json_t *cfg = json_object_get(run, "config");
        const char *wd = json_string_value(json_object_get(cfg, "workdir"));
        const char *us = json_string_value(json_object_get(cfg, "user"));
        if (wd && *wd)
                json_object_set_new(req, "cwd", json_string(wd));
        if (us && *us)
                json_object_set_new(req, "user", json_string(us));
        if (timeout_s > 0)
                json_object_set_new(req, "timeout_s", json_integer(timeout_s));
        return req;
}

/* One run of ready_cmd: 0 with *code its exit code (-1: none), tail its output's end; -1
 * when the sandbox's channel failed. */
static int ready_once(struct cove_chan *c, const struct cove_sandbox_row *s, json_t *run,
                      int timeout_s, int *code, char *tail, struct cove_err *err)
{
        const char *cmd = json_string_value(json_object_get(run, "ready_cmd"));
        json_t *req = shell_req(s, run, cmd, timeout_s);
        json_t *desc = json_pack("[s, s, s]", "/bin/sh", "-c", cmd);
        uint32_t pid = 0;
        int rc = cove_chan_exec_ex(c, req, "ready", desc, 1, &pid, err);
        json_decref(req);
        json_decref(desc);
        if (rc < 0)
                return -1;
        *code = -1;
        uint64_t after = 0;
        int64_t until = cove_mono_ns() + (int64_t)(timeout_s + 5) * 1000000000LL;
        int done = 0;
        while (!done && rc == 0) {
                struct cove_ev *e = NULL;
                uint64_t lost = 0;
                int r = cove_chan_proc_next(c, pid, after, &e, &lost, 1000, err);
                if (r == 0) {
                        if (cove_mono_ns() > until)
                                done = 1; /* the guest did not end it: counts as a failure */
                        continue;
                }
                if (r == 2) {
                        after = lost;
                        continue;
                }
                if (r != 1) {
                        rc = cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                           "ready_cmd: the sandbox's channel ended");
                        break;
                }
                after = e->seq;
                if (e->type == COVE_EV_STDOUT || e->type == COVE_EV_STDERR) {
                        size_t have = strlen(tail), k = e->len < TAIL_MAX - 1 ? e->len : 0;
                        if (have + k >= TAIL_MAX)
                                have = 0;
                        memcpy(tail + have, e->data, k);
                        tail[have + k] = '\0';
                } else if (e->type == COVE_EV_EXIT) {
                        json_error_t je;
                        json_t *x = json_loadb((const char *)e->data, e->len, 0, &je);
                        json_t *ec = json_object_get(x, "exit_code");
                        if (json_is_integer(ec))
                                *code = (int)json_integer_value(ec);
                        json_decref(x);
                        done = 1;
                } else if (e->type == COVE_EV_ERROR) {
                        rc = cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                           "ready_cmd: the sandbox stopped");
                }
                free(e);
        }
        cove_chan_proc_unhold(c, pid);
        cove_chan_proc_forget(c, pid); /* the ready checks do not crowd the process list */
        return rc;
}

int coved_template_start(struct coved *d, const struct cove_sandbox_row *s, json_t *run,
                         struct cove_err *err)
{
        struct cove_chan *c = cove_node_chan(d->node, s->id);
        if (!c)
                return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                                     "template %s: sandbox %s has no guest channel",
                                     s->template_name, s->id);
        int rc = 0;
        const char *start = json_string_value(json_object_get(run, "start_cmd"));
        if (start) {
                json_t *req = shell_req(s, run, start, 0);
                json_t *desc = json_pack("[s, s, s]", "/bin/sh", "-c", start);
                uint32_t pid = 0;
                rc = cove_chan_exec(c, req, "start", desc, &pid, err);
                json_decref(req);
                json_decref(desc);
                if (rc < 0)
                        cove_err_wrap(err, "template %s: start_cmd", s->template_name);
        }
        const char *ready = json_string_value(json_object_get(run, "ready_cmd"));
        int limit_s = (int)json_integer_value(json_object_get(run, "ready_timeout_s"));
        if (limit_s <= 0)
                limit_s = COVE_TEMPLATE_READY_TIMEOUT_S;
        int64_t until = cove_mono_ns() + (int64_t)limit_s * 1000000000LL;
        int code = -1, tries = 0;
        char tail[TAIL_MAX] = "";
        while (rc == 0 && ready) {
                int64_t left_ns = until - cove_mono_ns();
                if (left_ns <= 0 && tries > 0)
                        break;
                int left_s = (int)(left_ns / 1000000000LL) + 1;
                tail[0] = '\0';
                rc = ready_once(c, s, run, left_s < READY_TRY_MAX_S ? left_s : READY_TRY_MAX_S,
                                &code, tail, err);
                tries++;
                if (rc == 0 && code == 0)
                        break;
                struct timespec ts = {0, READY_EVERY_MS * 1000000L};
                nanosleep(&ts, NULL);
        }
        cove_chan_unref(c);
        if (rc < 0 || !ready || code == 0)
                return rc;
        for (char *p = tail; *p; p++) /* the guest's bytes: printable ASCII only */
                if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e)
                        *p = ' ';
        char last[48];
        if (code < 0)
                snprintf(last, sizeof last, "had no exit code");
        else
                snprintf(last, sizeof last, "exited with %d", code);
        return cove_err_setk(err, COVE_E_UNAVAILABLE, 0,
                             "template %s: ready_cmd did not exit 0 within %d s (%d tries; the "
                             "last %s%s%.200s)",
                             s->template_name, limit_s, tries, last, tail[0] ? ": " : "", tail);
}
