"""A job as a JetStream message: the room kept for jobfence's headers and their size on the
wire, what the headers cannot carry after a nak (:class:`MessageState`, kept in the state stream),
and the token of a delivery."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from nats.aio.msg import Msg

from ...core.jobs import AttemptRecord, history_from, history_json
from .._broker import fit_traces

#: Bytes of a message's max_payload kept for jobfence's headers. NATS counts headers into
#: max_payload; the longest headers of a first publish (a 255-character job id and
#: correlation id of 4-byte characters, percent-encoded: 3 060 bytes each, plus the attempt
#: count, enqueue time, delay and the expected stream's name) take under 7 KiB, and a W3C
#: trace context (traceparent and tracestate) at most 1 KiB more.
HEADER_ROOM = 9 * 1024
SAFE_CHARS = " !#$%&'()*+,-./:;<=>?@[]^_`{|}~"


@dataclass
class MessageState:
    """What a message's headers cannot carry after a nak: history and refunds."""

    refunds: int = 0
    history: list[AttemptRecord] = field(default_factory=list)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "refunds": self.refunds,
                "history": json.loads(history_json(fit_traces(self.history))),
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> MessageState:
        raw = json.loads(data)
        return cls(int(raw.get("refunds", 0)), history_from(json.dumps(raw.get("history", []))))


@dataclass
class MessageToken:
    msg: Msg  # the job message (or, for an exhausted one, the advisory)
    stream: str
    seq: int
    state: MessageState | None
    exhausted: bool = False


def header_bytes(headers: dict[str, str]) -> int:
    """The size of ``headers`` on the wire (``NATS/1.0``, a line each, a blank line)."""
    return len(b"NATS/1.0\r\n\r\n") + sum(
        len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items()
    )
