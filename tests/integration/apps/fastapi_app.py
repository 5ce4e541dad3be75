"""A FastAPI service instrumented with Outrider's ASGI middleware, as a user writes it; uvicorn serves it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from fastapi import FastAPI, HTTPException
from fastapi.responses import StreamingResponse

from outrider import OutriderMiddleware

app = FastAPI()
app.add_middleware(OutriderMiddleware, gen_ai_provider="vllm")


@app.get("/items/{item_id}")
async def item(item_id: int) -> dict[str, int]:
    return {"item": item_id}


@app.post("/v1/chat")
async def chat() -> StreamingResponse:
    async def tokens() -> AsyncIterator[bytes]:
        for token in (b"Hello", b" there", b"!"):
            await asyncio.sleep(0.01)
            yield token
    return StreamingResponse(tokens(), media_type="text/plain")


@app.get("/busy")
async def busy() -> None:
    raise HTTPException(status_code=503, detail="overloaded")
