from tests.support import ServerProcess, client, sse


async def test_create_and_stream(server: ServerProcess, owner_key: tuple[str, str]) -> None:
    _, key = owner_key
    async with client(server.url, key) as http:
        created = (await http.post("/api/agent", json={"prompt": "hi"})).json()
        async with sse(http, f"/api/agent/{created['id']}/events", follow="false") as events:
            seen = [e async for e in events]
    assert [e.event for e in seen] == ["user_message", "caught_up"]
