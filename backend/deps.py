"""FastAPI dependencies: settings, database session, ingest service, bearer-token check.

The ones that only read the app's state are `async def`: FastAPI runs a plain `def`
dependency in its thread pool, two thread hand-offs a request for an attribute read.
"""

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from sqlmodel import Session

from kvscope.backend.ingest.pipeline import Pipeline
from kvscope.backend.settings import Settings, token_matches


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    with Session(request.app.state.engine) as session:
        yield session


async def get_ingest(request: Request) -> Pipeline:
    return request.app.state.ingest


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
IngestDep = Annotated[Pipeline, Depends(get_ingest)]


async def require_token(request: Request, settings: SettingsDep) -> None:
    if not token_matches(settings, request.headers.get("authorization")):
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing or wrong bearer token: send 'Authorization: Bearer <KVSCOPE_BACKEND_TOKEN>'",
            headers={"WWW-Authenticate": "Bearer"},
        )


TokenDep = Depends(require_token)
