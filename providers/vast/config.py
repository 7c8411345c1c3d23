"""The Vast.ai market's settings (``vast:`` in the configuration; docs/vast.md)."""

from __future__ import annotations

from pydantic import Field, SecretStr, model_validator

from broker.configbase import (
    Attempts,
    Count,
    Fraction,
    HttpUrl,
    MarketSection,
    Seconds,
    SecondsOrOff,
    Usd,
    alias,
    secret,
    secret_or_file,
)


class VastConfig(MarketSection):
    enabled: bool = False
    url: HttpUrl = alias("LOCKSTEP_VAST_URL", "https://console.vast.ai")
    api_key: SecretStr | None = secret("api_key_file", "LOCKSTEP_VAST_API_KEY", credential=True)
    api_key_file: str | None = None  # a mounted secret holding the key; read when the settings load
    timeout_s: Seconds = 15.0
    create_timeout_s: Seconds = 120.0  # creates and log requests: the CLI's 120 s
    max_attempts: Attempts = 5
    # A call and its retries start no attempt after this (searches run inside broker.provider_timeout_s).
    retry_budget_s: Seconds = 25.0
    # The instance list is read once per poll round (not one call per instance: Vast rate-limits per
    # endpoint and key): polls within list_reuse_s of the last read use it (0: read every time).
    list_reuse_s: SecondsOrOff = 2.0
    # A multi-machine job's head is rented first; its peers once Vast shows its mapped rendezvous port.
    ports_wait_s: Seconds = 600.0
    min_reliability: Fraction = 0.9
    verified_only: bool = True
    egress_usd_per_gb: Usd = 0.0
    # Retry pacing (tests shorten it); Retry-After from the API is honoured up to retry_after_max_s.
    backoff_initial_s: Seconds = 0.5
    backoff_max_s: Seconds = 20.0
    retry_after_max_s: Seconds = 30.0
    min_inet_down_mbps: float = Field(default=0.0, ge=0, le=1e6)  # pushed down to the search; 0 = no floor
    search_limit: int = Field(default=256, ge=1, le=100_000)  # offers asked for per search
    # A job's log comes through Vast's logs API (docs/vast.md): the last log_tail_lines lines, read from the
    # result URL it gives, polled every log_poll_s until it is there (log_wait_s at most).
    log_tail_lines: Count = 10_000
    log_wait_s: Seconds = 15.0
    log_poll_s: Seconds = 0.3

    @model_validator(mode="after")
    def _key_from_file(self) -> VastConfig:
        self.api_key = secret_or_file(self.api_key, self.api_key_file, "api_key_file",
                                      "api_key (LOCKSTEP_VAST_API_KEY)")
        return self

    def check_with_broker(self, provider_timeout_s: float) -> None:
        # A search runs inside broker.provider_timeout_s: retries started past it are calls Vast rate-limits for
        # nothing (the broker has given up on the answer).
        if self.retry_budget_s >= provider_timeout_s:
            raise ValueError(f"retry_budget_s ({self.retry_budget_s:g} s) must be below "
                             f"broker.provider_timeout_s ({provider_timeout_s:g} s)")
