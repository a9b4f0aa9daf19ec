/* server.h — `tessera serve`: wires the HTTP front end (http/), the OpenAI wire format
 * (api/) and the engine (engine/) into a daemon.
 *
 * Start-up: the HTTP server listens first, so /health answers 503 while the model loads;
 * then the model and the engine come up and /health turns 200. SIGTERM / SIGINT start a
 * drain: /health and new requests get 503, live requests run to completion (bounded by
 * --drain-timeout, after which they are aborted: a stream ends with an error event), then everything is torn down and
 * server_run returns 0.
 *
 * Routes (see docs/api.md): POST /v1/chat/completions, POST /v1/completions,
 * POST /v1/responses, GET and DELETE /v1/responses/{id}, POST /v1/responses/{id}/cancel,
 * GET /v1/responses/{id}/input_items,
 * GET /v1/models, GET /health, GET /metrics, POST /tokenize, POST /detokenize,
 * GET /version.
 */
#ifndef TESSERA_SERVER_SERVER_H
#define TESSERA_SERVER_SERVER_H

struct server_options;

/* Runs the server until SIGTERM / SIGINT. Must be called from the main thread before any
 * other thread exists (it blocks those signals for every thread it starts and waits for
 * them with sigwait). Returns the process exit status: 0 after a clean drain, 1 if the
 * model or the engine failed to start or the port cannot be bound. */
int server_run(const struct server_options *o);

#endif
