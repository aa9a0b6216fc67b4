"""The JSON-RPC side of the server: every request gets a result or an error.

pygls drops a request whose params do not match the protocol's types (no position, a negative
line, no command) after logging a traceback, so the client waits forever; after `shutdown` it
drops requests silently; an unknown command is answered, but with a traceback at ERROR level;
before `initialize` it answers InternalError (its workspace does not exist yet). This protocol
answers each of these with a JSON-RPC error: InvalidParams, InvalidRequest after shutdown,
InvalidParams naming the known commands, ServerNotInitialized before `initialize` (where LSP
says notifications are dropped, `exit` aside), logged as one line. A frame the transport
refuses (`framing`), a body that is no JSON (ParseError) and JSON that is no JSON-RPC message
(InvalidRequest) are answered with the request's id where one can be read, else a null id.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from lsprotocol import types
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import JsonRPCNotification, JsonRPCRequestMessage
from pygls.protocol.language_server import lsp_method

from llmmem_lsp.disk_documents import bound_disk_reads

log = logging.getLogger("llmmem_lsp")

PROGRESS_COMMANDS = frozenset({"llmmem.verify"})  # commands that report a client's progress


@dataclass(frozen=True)
class UnreadableRequest:
    """A request whose params could not be read: answered with InvalidParams."""

    id: int | str
    method: str
    reason: str


@dataclass(frozen=True)
class Refused:
    """A message that is no valid JSON-RPC 2.0 message (a request's error says why; a
    notification or a response is only logged, as nothing answers those)."""

    id: int | str | None
    reason: str
    answer: bool


def uri_argument(arguments: Any) -> str | None:
    """The document a command names first: `[uri, ...]` or `[{"uri": ...}, ...]`."""
    if isinstance(arguments, (list, tuple)) and arguments:
        first = arguments[0]
        if isinstance(first, str):
            return first
        if isinstance(first, dict) and isinstance(first.get("uri"), str):
            return first["uri"]
    return None


def _arguments_problem(command: str, arguments: Any) -> str | None:
    """Why a command's arguments cannot be used (InvalidParams), or None."""
    if command == "llmmem.verify":
        if uri_argument(arguments) is None:
            return 'takes the document\'s URI first: [uri] or [uri, {"simulate": true}]'
    return None


def _valid_id(ident: Any) -> bool:
    return ident is None or (isinstance(ident, (int, str)) and not isinstance(ident, bool))


def _reason(err: Exception) -> str:
    try:
        from cattrs import transform_error

        return "; ".join(transform_error(err)) or str(err)
    except Exception:
        return str(err)


class LlmmemProtocol(LanguageServerProtocol):
    """pygls's protocol, with every request answered (see the module's doc) and requests that
    a client cancels really stopped: pygls runs a command's coroutine as a task of its own and,
    on `$/cancelRequest`, cancels only the future of the answer, so the command ran on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stoppable: dict[int | str, asyncio.Task[Any]] = {}
        self.initialize_received = False
        # the `workDoneToken` a client gave with `workspace/executeCommand`, by request id
        self._work_done_tokens: dict[int | str, int | str] = {}

    @lsp_method(types.INITIALIZE)
    def lsp_initialize(self, params: types.InitializeParams) -> Generator[Any, Any, Any]:
        """pygls's `initialize`, its workspace reading unopened files within bounds."""
        result = yield from super().lsp_initialize(params)
        bound_disk_reads(self._workspace)
        return result

    def stop_with_request(self) -> None:
        """Called by a long command (verify) in its coroutine: `$/cancelRequest` for the
        request that started it cancels it (its `finally` ends what it started)."""
        msg_id, task = self.msg_id, asyncio.current_task()
        if msg_id is None or task is None:
            return
        self._stoppable[msg_id] = task
        task.add_done_callback(lambda _: self._stoppable.pop(msg_id, None))

    def client_progress_token(self) -> int | str | None:
        """The progress token the client created for the request being run (its
        `workDoneToken`): the command reports on it, and its cancel stops the command."""
        msg_id = self.msg_id
        return self._work_done_tokens.get(msg_id) if msg_id is not None else None

    def forget_progress_token(self) -> None:
        msg_id = self.msg_id
        if msg_id is not None:
            self._work_done_tokens.pop(msg_id, None)

    def _handle_cancel_notification(self, msg_id: Any) -> None:
        task = self._stoppable.pop(msg_id, None)
        if task is not None:
            task.cancel()
        super()._handle_cancel_notification(msg_id)

    def cancel_pending_requests(self) -> None:
        """At `shutdown`: cancel what is still pending, the shutdown request aside. (pygls does
        it too, in a loop over the dict that the cancellation's own callbacks change.)"""
        current = self.msg_id
        for msg_id, task in list(self._stoppable.items()):
            if msg_id != current:
                task.cancel()
        for msg_id, future in list(self._request_futures.items()):
            if msg_id != current and not future.done():
                future.cancel()

    def structure_message(self, data: dict[str, Any]) -> Any:
        if "jsonrpc" not in data:
            return data  # a nested object, or no JSON-RPC message (see handle_message)
        refused = self._envelope_problem(data)
        if refused is not None:
            return refused
        if "method" not in data:  # a response to one of the server's requests
            try:
                return super().structure_message(data)
            except Exception as err:
                return Refused(data.get("id"), f"unreadable response: {_reason(err)}", False)
        method = data["method"]
        if "id" not in data:  # a notification: nothing answers it, a bad one is logged
            notification_type = self.get_message_type(method)
            if notification_type is None:  # unknown: pygls ignores it, params or not
                data = {"params": None, **data}
                notification_type = JsonRPCNotification
            try:
                return self._converter.structure(data, notification_type)
            except Exception as err:
                return Refused(None, f"invalid params for {method}: {_reason(err)}", False)
        request_type = self.get_message_type(method)
        if request_type is None:  # unknown: pygls answers MethodNotFound, params or not
            data = {"params": None, **data}
            request_type = JsonRPCRequestMessage
        try:
            return self._converter.structure(data, request_type)
        except Exception as err:
            return UnreadableRequest(id=data["id"], method=str(method), reason=_reason(err))

    @staticmethod
    def _envelope_problem(data: dict[str, Any]) -> Refused | None:
        """Why a message is no JSON-RPC 2.0 request, notification or response, if it is not."""
        ident = data.get("id")
        known = ident if _valid_id(ident) else None
        is_request = "method" in data and "id" in data
        if data.get("jsonrpc") != "2.0":
            return Refused(known, 'jsonrpc must be "2.0"', is_request or "method" not in data)
        if not _valid_id(ident):
            return Refused(None, "an id must be a number or a string", True)
        if "method" in data and not isinstance(data["method"], str):
            return Refused(known, "method must be a string", is_request)
        if "method" not in data and "result" not in data and "error" not in data:
            if "id" in data:  # a response of the client's that says nothing: logged
                return Refused(known, "a response needs a result or an error", False)
            return Refused(None, "a message needs a method, or a result or an error", True)
        return None

    def _refuse(self, msg_id: int | str | None, code: int, message: str) -> None:
        # written as a plain object: the converter would leave a null id out
        error = {"code": int(code), "message": message}
        self._send_data({"jsonrpc": "2.0", "id": msg_id, "error": error})

    def refuse_frame(self, msg_id: int | str | None, code: int, reason: str) -> None:
        """A frame the transport could not read as a message: its error, with the id of the
        request where one was read (null where none was)."""
        log.info("a message refused (%d): %s", code, reason)
        self._refuse(msg_id, code, reason)

    def _before_initialize(self, message: Any) -> bool:
        """Whether `message` was dealt with because `initialize` has not come: a request is
        refused with ServerNotInitialized, a notification (`exit` aside) dropped."""
        method = getattr(message, "method", None)
        msg_id = getattr(message, "id", None)
        if method is None:
            return False  # a response, or no valid JSON-RPC message: answered as ever
        if method == types.INITIALIZE and msg_id is not None:
            if not isinstance(message, UnreadableRequest):
                self.initialize_received = True
            return False
        if msg_id is not None:
            log.info("%s before initialize: refused", method)
            self._refuse(
                msg_id,
                types.ErrorCodes.ServerNotInitialized,
                f"the server is not initialized: {method} refused (send initialize first)",
            )
            return True
        if method == types.EXIT:
            return False
        log.info("%s before initialize: dropped", method)
        return True

    def handle_message(self, message: Any) -> None:
        if not self.initialize_received and self._before_initialize(message):
            return
        if isinstance(message, UnreadableRequest):
            log.info("invalid params for %s: %s", message.method, message.reason)
            self._refuse(
                message.id,
                types.ErrorCodes.InvalidParams,
                f"invalid params for {message.method}: {message.reason}",
            )
            return
        if isinstance(message, Refused):
            log.info("not a valid JSON-RPC 2.0 message: %s", message.reason)
            if message.answer:
                self._refuse(message.id, types.ErrorCodes.InvalidRequest, message.reason)
            return
        if not hasattr(message, "jsonrpc"):  # JSON, but no JSON-RPC 2.0 message
            ident = message.get("id") if isinstance(message, dict) else None
            known = ident if isinstance(ident, (int, str)) and not isinstance(ident, bool) else None
            log.info("not a JSON-RPC 2.0 message: %.200r", message)
            self._refuse(known, types.ErrorCodes.InvalidRequest, "not a JSON-RPC 2.0 message")
            return
        method = getattr(message, "method", None)
        if self._shutdown and method != types.EXIT and getattr(message, "id", None) is not None:
            if method is not None:  # a request, not a response to one of ours
                self._refuse(
                    message.id,
                    types.ErrorCodes.InvalidRequest,
                    f"the server is shutting down: {method} refused",
                )
                return
        super().handle_message(message)

    def _handle_request(self, msg_id: Any, method_name: str, params: Any) -> None:
        if method_name == types.WORKSPACE_EXECUTE_COMMAND:
            command = getattr(params, "command", None)
            if not isinstance(command, str) or command not in self.fm.commands:
                known = ", ".join(sorted(self.fm.commands))
                log.info("unknown command %r", command)
                self._refuse(
                    msg_id,
                    types.ErrorCodes.InvalidParams,
                    f"unknown command {command!r} (known: {known})",
                )
                return
            why = _arguments_problem(command, getattr(params, "arguments", None))
            if why is not None:
                log.info("%s: %s", command, why)
                self._refuse(msg_id, types.ErrorCodes.InvalidParams, f"{command}: {why}")
                return
            token = getattr(params, "work_done_token", None)
            reports = command in PROGRESS_COMMANDS  # the commands that report on it
            if reports and isinstance(token, (int, str)) and not isinstance(token, bool):
                self._work_done_tokens[msg_id] = token
        super()._handle_request(msg_id, method_name, params)
