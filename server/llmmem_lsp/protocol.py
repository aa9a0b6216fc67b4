"""The JSON-RPC side of the server: every request gets a result or an error.

pygls drops a request whose params do not match the protocol's types (no position, a negative
line, no command) after logging a traceback, so the client waits forever; after `shutdown` it
drops requests silently; an unknown command is answered, but with a traceback at ERROR level.
This protocol answers each of these with a JSON-RPC error: InvalidParams, InvalidRequest after
shutdown, and InvalidParams naming the known commands, logged as one line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from lsprotocol import types
from pygls.protocol import LanguageServerProtocol
from pygls.protocol.json_rpc import JsonRPCRequestMessage

log = logging.getLogger("llmmem_lsp")


@dataclass(frozen=True)
class UnreadableRequest:
    """A request whose params could not be read: answered with InvalidParams."""

    id: int | str
    method: str
    reason: str


def _reason(err: Exception) -> str:
    try:
        from cattrs import transform_error

        return "; ".join(transform_error(err)) or str(err)
    except Exception:
        return str(err)


class LlmmemProtocol(LanguageServerProtocol):
    def structure_message(self, data: dict[str, Any]) -> Any:
        is_request = "jsonrpc" in data and "id" in data and "method" in data
        if not is_request or "error" in data:
            return super().structure_message(data)
        method = data["method"]
        request_type = self.get_message_type(method) or JsonRPCRequestMessage
        try:
            return self._converter.structure(data, request_type)
        except Exception as err:
            return UnreadableRequest(id=data["id"], method=str(method), reason=_reason(err))

    def _refuse(self, msg_id: int | str, code: types.ErrorCodes, message: str) -> None:
        self._send_response(msg_id, None, types.ResponseError(code=code, message=message))

    def handle_message(self, message: Any) -> None:
        if isinstance(message, UnreadableRequest):
            log.info("invalid params for %s: %s", message.method, message.reason)
            self._refuse(
                message.id,
                types.ErrorCodes.InvalidParams,
                f"invalid params for {message.method}: {message.reason}",
            )
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
            if command not in self.fm.commands:
                known = ", ".join(sorted(self.fm.commands))
                log.info("unknown command %r", command)
                self._refuse(
                    msg_id,
                    types.ErrorCodes.InvalidParams,
                    f"unknown command {command!r} (known: {known})",
                )
                return
        super()._handle_request(msg_id, method_name, params)
