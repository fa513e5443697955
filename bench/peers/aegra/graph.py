"""The Aegra side of `bench.agent_protocol`: the same tool-call work as Ferryman's scripted
session (a model turn that says "Noting." and calls `put_note`, then a turn that answers
"Done."), as a LangGraph graph with a deterministic fake chat model.

The model picks its turn from the conversation (after a tool result: "Done."; else the tool
call), so concurrent runs share nothing. It streams natively async, one chunk per
whitespace-separated token and the tool call as a `tool_call_chunks` chunk, as a provider's
client would: LangGraph's `messages` stream mode sends each chunk. `put_note` writes the note to
the server's store (Aegra's PostgreSQL store), as Ferryman's `put_note` writes the session's
note to its database.

Loaded by Aegra through aegra.json in this directory (`graphs.agent`); runs in Aegra's own venv
(`python -m bench.agent_protocol venv`), never imported by Ferryman.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Annotated, Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedStore, ToolNode, tools_condition
from langgraph.store.base import BaseStore

NOTE_ARGUMENTS = {"key": "k", "text": "v"}


def _turn(messages: list[BaseMessage]) -> AIMessage:
    """The scripted turn for this conversation: the tool call first, "Done." after its result."""
    message_id = f"run-{uuid.uuid4()}"
    if messages and isinstance(messages[-1], ToolMessage):
        return AIMessage(content="Done.", id=message_id)
    call = {"name": "put_note", "args": NOTE_ARGUMENTS, "id": f"call_{uuid.uuid4().hex[:12]}"}
    return AIMessage(content="Noting.", tool_calls=[call], id=message_id)


def _chunks(message: AIMessage) -> Iterator[ChatGenerationChunk]:
    """`message` token by token (whitespace kept), then its tool calls as one chunk."""
    assert isinstance(message.content, str)
    for token in re.split(r"(\s)", message.content):
        if token:
            yield ChatGenerationChunk(message=AIMessageChunk(content=token, id=message.id))
    if message.tool_calls:
        tool_call_chunks = [
            {"name": c["name"], "args": json.dumps(c["args"]), "id": c["id"], "index": i}
            for i, c in enumerate(message.tool_calls)
        ]
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", id=message.id, tool_call_chunks=tool_call_chunks)
        )


class ScriptedChatModel(BaseChatModel):
    """A deterministic chat model: `_turn` of the conversation, streamed by `_chunks`."""

    @property
    def _llm_type(self) -> str:
        return "scripted-bench"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedChatModel:
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=_turn(messages))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for chunk in _chunks(_turn(messages)):
            if run_manager:
                run_manager.on_llm_new_token(str(chunk.message.content), chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        for chunk in _chunks(_turn(messages)):
            if run_manager:
                await run_manager.on_llm_new_token(str(chunk.message.content), chunk=chunk)
            yield chunk


@tool
async def put_note(
    key: str,
    text: str,
    config: RunnableConfig,
    store: Annotated[BaseStore, InjectedStore()],
) -> str:
    """Keep a note under `key` for this thread."""
    thread_id = str(config.get("configurable", {}).get("thread_id", "stateless"))
    await store.aput(("notes", thread_id), key, {"text": text})
    return "noted"


model = ScriptedChatModel()


async def agent(state: MessagesState, config: RunnableConfig) -> dict[str, list[BaseMessage]]:
    return {"messages": [await model.ainvoke(state["messages"], config)]}


builder = StateGraph(MessagesState)
builder.add_node("agent", agent)
builder.add_node("tools", ToolNode([put_note]))
builder.add_edge(START, "agent")
builder.add_conditional_edges("agent", tools_condition)
builder.add_edge("tools", "agent")
graph = builder.compile()
