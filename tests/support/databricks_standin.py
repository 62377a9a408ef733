"""A local stand-in for the few Databricks REST endpoints that
``dist_dl.app.databricks.jobs`` calls, for tests: an ``http.server`` on
127.0.0.1 in a thread that checks the bearer token, records every request and
keeps state (jobs, uploaded workspace files, runs).

Runs move one step on every ``runs/get``: PENDING, then each task RUNNING in
turn, then TERMINATED with SUCCESS, or FAILED at ``fail_task`` (the tasks
after it UPSTREAM_FAILED). Only what the client code uses is modelled; the
databricks-sdk on the other side is the real one.
"""
from __future__ import annotations

import copy
import email.parser
import email.policy
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

__all__ = ["DatabricksStandIn", "Request"]


@dataclass
class Request:
    method: str
    path: str                       # without the /api/2.x prefix for jobs: "jobs/create"
    query: dict[str, str]
    body: Any = None                # parsed JSON, or the form fields of a multipart upload
    files: dict[str, bytes] = field(default_factory=dict)


class _Refusal(Exception):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


class DatabricksStandIn:
    """Use as a context manager; ``host`` and ``token`` are what a client needs.

    Attributes:
        token: The token that authenticates; any other gets HTTP 401.
        forbidden_token: A token that authenticates but gets HTTP 403.
        user_name: What ``/preview/scim/v2/Me`` answers.
        fail_task: Task key whose runs fail (None: runs succeed).
        legacy_state: False: runs carry only the newer ``status`` field.
        requests: Every request received, in order.
        jobs: job id -> settings (dict).
        files: workspace path -> bytes.
    """

    def __init__(self, token: str = "standin-token"):
        self.token = token
        self.forbidden_token = "no-permission-token"
        self.user_name = "someone@example.com"
        self.fail_task: str | None = None
        self.legacy_state = True
        self.requests: list[Request] = []
        self.jobs: dict[int, dict] = {}
        self.files: dict[str, bytes] = {}
        self.folders: set[str] = set()
        self._runs: dict[int, dict] = {}
        self._next_id = 100
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -------------------------------------------------------------- lifecycle

    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> "DatabricksStandIn":
        standin = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                standin._handle(self, "GET")

            def do_POST(self):
                standin._handle(self, "POST")

            def log_message(self, *args):  # keep the test output clean
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        # a short poll interval: shutdown() waits for one
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def calls(self, path: str) -> list[Request]:
        """The recorded requests to ``path`` (e.g. ``"jobs/create"``)."""
        return [r for r in self.requests if r.path == path]

    # -------------------------------------------------------------- HTTP

    def _handle(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        url = urlparse(handler.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        path = url.path
        for prefix in ("/api/2.2/", "/api/2.1/", "/api/2.0/"):
            if path.startswith(prefix):
                path = path[len(prefix):]
        request = Request(method, path, query)
        kind = handler.headers.get("Content-Type", "")
        if kind.startswith("multipart/form-data"):
            request.body, request.files = _multipart(kind, raw)
        elif raw:
            request.body = json.loads(raw)
        try:
            if path == "/.well-known/databricks-config":
                # host discovery, unauthenticated: a workspace host, nothing more
                status, answer = 200, {"workspace_id": "1234567890"}
                return self._reply(handler, status, answer)
            auth = handler.headers.get("Authorization", "")
            if auth == f"Bearer {self.forbidden_token}":
                with self._lock:
                    self.requests.append(request)
                raise _Refusal(403, "PERMISSION_DENIED", "This user does not have permission")
            if auth != f"Bearer {self.token}":
                raise _Refusal(401, "UNAUTHENTICATED", "Invalid access token.")
            with self._lock:
                self.requests.append(request)
                status, answer = 200, self._route(request)
        except _Refusal as refusal:
            status = refusal.status
            answer = {"error_code": refusal.code, "message": refusal.message}
        self._reply(handler, status, answer)

    @staticmethod
    def _reply(handler: BaseHTTPRequestHandler, status: int, answer: dict) -> None:
        data = json.dumps(answer).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _route(self, r: Request) -> dict:
        if r.path == "preview/scim/v2/Me":
            return {"userName": self.user_name, "id": "1"}
        if r.path == "workspace/mkdirs":
            self.folders.add(r.body["path"])
            return {}
        if r.path == "workspace/import":
            target = r.body["path"]
            parent = target.rsplit("/", 1)[0]
            if parent not in self.folders:
                raise _Refusal(404, "RESOURCE_DOES_NOT_EXIST", f"The parent folder ({parent}) "
                                                                "does not exist.")
            if target in self.files and r.body.get("overwrite") != "true":
                raise _Refusal(400, "RESOURCE_ALREADY_EXISTS", f"{target} already exists")
            self.files[target] = r.files["content"]
            return {}
        if r.path == "jobs/create":
            job_id = self._new_id()
            self.jobs[job_id] = copy.deepcopy(r.body)
            return {"job_id": job_id}
        if r.path == "jobs/reset":
            self._job(r.body["job_id"])
            self.jobs[int(r.body["job_id"])] = copy.deepcopy(r.body["new_settings"])
            return {}
        if r.path == "jobs/list":
            name = r.query.get("name")
            found = [{"job_id": i, "settings": {"name": s.get("name")}}
                     for i, s in self.jobs.items()
                     if name is None or (s.get("name") or "").lower() == name.lower()]
            return {"jobs": found, "has_more": False} if found else {"has_more": False}
        if r.path == "jobs/get":
            job_id = int(r.query["job_id"])
            return {"job_id": job_id, "settings": self._job(job_id)}
        if r.path == "jobs/run-now":
            return self._start(int(r.body["job_id"]), r.body.get("job_parameters") or {})
        if r.path == "jobs/runs/get":
            return self._advance(int(r.query["run_id"]))
        if r.path == "jobs/runs/get-output":
            task_run = int(r.query["run_id"])
            for run in self._runs.values():
                for task in run["tasks"]:
                    if task["run_id"] == task_run:
                        error = f"ValueError: {task['task_key']} failed in the stand-in" \
                            if task["task_key"] == run["fail_task"] else None
                        return {"error": error, "metadata": {"run_id": task_run}} if error \
                            else {"metadata": {"run_id": task_run}}
            raise _Refusal(400, "INVALID_PARAMETER_VALUE", f"Run {task_run} does not exist.")
        raise _Refusal(404, "ENDPOINT_NOT_FOUND", f"the stand-in has no {r.method} {r.path}")

    def _job(self, job_id) -> dict:
        if int(job_id) not in self.jobs:
            raise _Refusal(400, "INVALID_PARAMETER_VALUE", f"Job {job_id} does not exist.")
        return self.jobs[int(job_id)]

    # -------------------------------------------------------------- runs

    def _start(self, job_id: int, parameters: dict) -> dict:
        settings = self._job(job_id)
        run_id = self._new_id()
        order = [t["task_key"] for t in settings.get("tasks", [])]
        self._runs[run_id] = {
            "job_id": job_id, "step": -1, "order": order, "fail_task": self.fail_task,
            "legacy_state": self.legacy_state, "parameters": parameters,
            "tasks": [{"task_key": key, "run_id": run_id * 100 + i} for i, key in enumerate(order)],
        }
        return {"run_id": run_id, "number_in_job": run_id}

    def _advance(self, run_id: int) -> dict:
        if run_id not in self._runs:
            raise _Refusal(400, "INVALID_PARAMETER_VALUE", f"Run {run_id} does not exist.")
        run = self._runs[run_id]
        order = run["order"]
        failing = order.index(run["fail_task"]) if run["fail_task"] in order else None
        last = (failing if failing is not None else len(order) - 1) + 2
        run["step"] = min(run["step"] + 1, last)
        step = run["step"]
        # step 0: pending; step k (1..n): task k-1 running; last: terminated
        tasks = []
        for i, task in enumerate(run["tasks"]):
            if step == 0 or i > step - 1:
                state = ("PENDING", None, "")
            elif i < step - 1:
                state = ("TERMINATED", "SUCCESS", "")
            else:
                state = ("RUNNING", None, "")
            if step == last and failing is not None:
                if i == failing:
                    state = ("TERMINATED", "FAILED", "Workload failed, see run output for details")
                elif i > failing:
                    state = ("TERMINATED", "UPSTREAM_FAILED", "Upstream task failed.")
            elif step == last:
                state = ("TERMINATED", "SUCCESS", "")
            tasks.append(self._stamp(dict(task), state, run["legacy_state"]))
        if step == 0:
            state = ("PENDING", None, "Waiting for cluster")
        elif step < last:
            state = ("RUNNING", None, "")
        elif failing is not None:
            state = ("TERMINATED", "FAILED", f"Task {order[failing]} failed with message: "
                                             "Workload failed, see run output for details.")
        else:
            state = ("TERMINATED", "SUCCESS", "")
        answer = {"job_id": run["job_id"], "run_id": run_id,
                  "run_page_url": f"{self.host}/#job/{run['job_id']}/run/{run_id}",
                  "job_parameters": [{"name": k, "value": v} for k, v in run["parameters"].items()],
                  "tasks": tasks}
        return self._stamp(answer, state, run["legacy_state"])

    @staticmethod
    def _stamp(obj: dict, state: tuple, legacy: bool) -> dict:
        life, result, message = state
        if legacy:
            obj["state"] = {"life_cycle_state": life, "state_message": message,
                            **({"result_state": result} if result else {})}
        else:
            status = {"state": life}
            if result:
                code = {"SUCCESS": "SUCCESS", "UPSTREAM_FAILED": "SKIPPED"}.get(
                    result, "RUN_EXECUTION_ERROR")
                status["termination_details"] = {
                    "code": code, "type": "SUCCESS" if code == "SUCCESS" else "CLIENT_ERROR",
                    "message": message}
            obj["status"] = status
        return obj


def _multipart(content_type: str, raw: bytes) -> tuple[dict[str, str], dict[str, bytes]]:
    """Form fields and file parts of a multipart/form-data body."""
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + raw)
    fields, files = {}, {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True) or b""
        if part.get_filename() is not None:
            files[name] = payload
        else:
            fields[name] = payload.decode()
    return fields, files
