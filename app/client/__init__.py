"""The Python SDK: httpx only, no server imports.

async with FerrymanClient("http://127.0.0.1:8000", api_key=KEY) as ferryman:
    session = await ferryman.create_session("hello")
    async for event in ferryman.session_events(session["id"]):
        print(event.type, event.data)
"""

from app.client.sdk import ApiError, FerrymanClient, StreamEvent

__all__ = ["ApiError", "FerrymanClient", "StreamEvent"]
