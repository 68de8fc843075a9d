"""A client for the llm server's gRPC API (proto/llm.proto): streamed generation, a
non-streaming helper, tokenize, model info and the standard health check."""
import dataclasses
from typing import Iterator, List, Optional, Sequence, Union

import os

import grpc

from llm_client._proto import llm_pb2, llm_pb2_grpc

# Keyword arguments of generate() / complete() that go into SamplingParams (vLLM's meaning;
# proto/llm.proto documents each): temperature, top_p, top_k, min_p, repetition_penalty,
# presence_penalty, frequency_penalty, max_tokens, stop, stop_token_ids, ignore_eos, seed,
# logprobs, logit_bias.
SAMPLING_PARAMS = frozenset(f.name for f in llm_pb2.SamplingParams.DESCRIPTOR.fields)

# grpc.health.v1.HealthCheckResponse.ServingStatus
HEALTH_STATUS = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


@dataclasses.dataclass
class Completion:
    """A finished generation: complete() returns one."""
    text: str
    token_ids: List[int]
    finish_reason: str  # "stop", "length", "abort" or "timeout" (a failed step: grpc.RpcError)
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    logprobs: list  # llm_pb2.TokenLogprob per token when logprobs were requested


class Stream:
    """The messages of one Generate call (llm_pb2.GenerateResponse: token_ids, text, logprobs;
    the last one also finish_reason and usage). Iterate it; cancel() aborts the request on
    the server (its KV cache is freed at the next engine step)."""

    def __init__(self, call):
        self._call = call

    def __iter__(self) -> Iterator[llm_pb2.GenerateResponse]:
        return iter(self._call)

    def text(self) -> Iterator[str]:
        """Only the text deltas."""
        for message in self._call:
            if message.text:
                yield message.text

    def cancel(self) -> None:
        self._call.cancel()


def _sampling(params: dict) -> llm_pb2.SamplingParams:
    unknown = sorted(set(params) - SAMPLING_PARAMS)
    if unknown:
        raise TypeError("unknown sampling parameter(s) %s; known: %s"
                        % (", ".join(unknown), ", ".join(sorted(SAMPLING_PARAMS))))
    params = {k: v for k, v in params.items() if v is not None}
    logit_bias = params.pop("logit_bias", None)
    if isinstance(params.get("stop"), str):
        params["stop"] = [params["stop"]]
    sampling = llm_pb2.SamplingParams(**params)
    for token_id, bias in (logit_bias or {}).items():
        sampling.logit_bias[int(token_id)] = float(bias)
    return sampling


def _health_request(service: str) -> bytes:
    # HealthCheckRequest{service = 1}: serialized by hand, so that the package needs no
    # grpcio-health-checking.
    data = service.encode()
    if not data:
        return b""
    length, varint = len(data), bytearray()
    while True:
        byte, length = length & 0x7F, length >> 7
        varint.append(byte | (0x80 if length else 0))
        if not length:
            return b"\x0a" + bytes(varint) + data


def _health_status(response: bytes) -> str:
    # HealthCheckResponse{status = 1 (enum, a one-byte varint)}; empty = UNKNOWN.
    status = response[1] if len(response) >= 2 and response[0] == 0x08 else 0
    return HEALTH_STATUS.get(status, str(status))


class Client:
    """client = Client("127.0.0.1:50051")
    for chunk in client.generate("Once upon a time", max_tokens=32, temperature=0):
        print(chunk.text, end="", flush=True)

    `timeout` is each call's gRPC deadline in seconds (None: none); calls raise
    grpc.RpcError (e.code(): INVALID_ARGUMENT, RESOURCE_EXHAUSTED, UNAVAILABLE, ...)."""

    def __init__(self, target: str = "127.0.0.1:50051", *, timeout: Optional[float] = 60.0,
                 channel: Optional[grpc.Channel] = None, api_key: Optional[str] = None):
        # The server's --api-key (default: $LLM_API_KEY), sent as `authorization: Bearer KEY`
        # on every Llm call (the health service needs none).
        key = os.environ.get("LLM_API_KEY", "") if api_key is None else api_key
        self._metadata = (("authorization", "Bearer " + key),) if key else None
        self._channel = channel or grpc.insecure_channel(target)
        self._owns_channel = channel is None
        self._stub = llm_pb2_grpc.LlmStub(self._channel)
        self._health = self._channel.unary_unary(
            "/grpc.health.v1.Health/Check", request_serializer=lambda b: b,
            response_deserializer=lambda b: b)
        self.timeout = timeout

    def close(self) -> None:
        if self._owns_channel:
            self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Blocks until the channel is connected (grpc.FutureTimeoutError otherwise)."""
        grpc.channel_ready_future(self._channel).result(timeout=timeout)

    def health(self, service: str = "") -> str:
        """grpc.health.v1 status of the server ("") or of a named service: "SERVING",
        "NOT_SERVING" (draining), "SERVICE_UNKNOWN" (a name the server does not know)."""
        try:
            return _health_status(self._health(_health_request(service), timeout=self.timeout))
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.NOT_FOUND:  # the protocol's answer for a bad name
                return "SERVICE_UNKNOWN"
            raise

    def generate(self, prompt: Union[str, Sequence[int]], *, request_id: str = "",
                 timeout_seconds: float = 0.0, **sampling) -> Stream:
        """Streams a completion of `prompt` (text, or token ids used as given). Keyword
        arguments are SamplingParams fields; timeout_seconds is the server's own limit
        (finish reason "timeout"), the client's deadline is self.timeout."""
        request = llm_pb2.GenerateRequest(sampling=_sampling(sampling), request_id=request_id,
                                          timeout_seconds=timeout_seconds)
        if isinstance(prompt, str):
            request.text = prompt
        else:
            request.token_ids.ids.extend(prompt)
        return Stream(self._stub.Generate(request, timeout=self.timeout, metadata=self._metadata))

    def complete(self, prompt: Union[str, Sequence[int]], **params) -> Completion:
        """generate() gathered into one Completion."""
        text, token_ids, logprobs, last = [], [], [], None
        for last in self.generate(prompt, **params):
            text.append(last.text)
            token_ids.extend(last.token_ids)
            logprobs.extend(last.logprobs)
        if last is None:
            raise RuntimeError("the server closed the stream without a message")
        usage = last.usage
        return Completion("".join(text), token_ids, last.finish_reason, usage.prompt_tokens,
                          usage.completion_tokens, usage.cached_prompt_tokens, logprobs)

    def tokenize(self, text: str) -> List[int]:
        return list(self._stub.Tokenize(llm_pb2.TokenizeRequest(text=text), timeout=self.timeout,
                                        metadata=self._metadata).token_ids)

    def model_info(self) -> llm_pb2.ModelInfoResponse:
        """model, max_model_len, vocab_size, kv_cache_tokens."""
        return self._stub.ModelInfo(llm_pb2.ModelInfoRequest(), timeout=self.timeout,
                                    metadata=self._metadata)
