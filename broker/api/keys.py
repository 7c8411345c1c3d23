"""Typed keys for what the application object carries (aiohttp's AppKey)."""

from __future__ import annotations

from aiohttp import web

from broker.api.auth import RateLimiter, TokenCache
from broker.api.metrics import ApiMetrics
from broker.models import TokenInfo
from broker.service import Lockstep

SERVICE = web.AppKey("service", Lockstep)
TOKENS = web.AppKey("tokens", TokenCache)
LIMITER = web.AppKey("limiter", RateLimiter)
BAD_TOKENS = web.AppKey("bad_tokens", RateLimiter)  # requests with unknown tokens, per client address
METRICS = web.AppKey("metrics", ApiMetrics)
OPENAPI = web.AppKey("openapi", dict)
# Request key for the caller's TokenInfo (RequestKey where this aiohttp has it).
AUTH = web.RequestKey("auth", TokenInfo) if hasattr(web, "RequestKey") else "lockstep.auth"
