"""The operations users have. The CLI and the HTTP API are thin shells over these, and reach the
store and the providers only through them.

One facade, :class:`Lockstep`, made of one module per domain, each a class over the shared
:class:`~broker.service.runtime.Runtime` (settings, clock, store, market, background loops):

=================  ==================  =====================================================================
module             class               operations
=================  ==================  =====================================================================
``offers``         OffersService       quote, offers, gpus, providers_health
``jobs``           JobsService         submit, submit_job, list_jobs, get_job, job_allocations, cancel,
                                       release_allocation, place_now, poll_now
``nodes``          NodesService        drain_node, resume_node, burnin (and ``Runtime.unhealthy_nodes``)
``prices``         PricesService       price_history, price_series, spikes, alerts, track_once,
                                       track_until, replay
``logs``           LogsService         job_logs, follow_logs (a job's log, live or kept; secrets masked)
``tenants``        TenantsService      create_tenant, list_tenants, get_tenant, update_tenant (each with
                                       its month-to-date spend), create_token, list_tokens, revoke_token,
                                       verify_token
``events``         EventsService       events, follow_events (the stream, from a cursor), create_webhook,
                                       list_webhooks, delete_webhook, webhook_deliveries,
                                       deliver_webhooks_now
``operations``     OperationsService   store_ok (readiness)
``runtime``        Runtime             store, market, db, refresh, ensure_offers, start/stop (the broker
                                       loops and the tracker), broker, tracker, aclose
=================  ==================  =====================================================================

A new operation goes into its domain's module (a new domain gets a module and a place in the
bases of :class:`Lockstep`). Bad input is a :class:`~broker.errors.SpecError`; each error class
says how the API and the CLI show it (broker/errors.py).
"""

from __future__ import annotations

from broker.service.events import EventsService
from broker.service.jobs import JobsService
from broker.service.logs import LogsService
from broker.service.nodes import NodesService
from broker.service.offers import OffersService
from broker.service.operations import OperationsService
from broker.service.planning import PlanningService
from broker.service.prices import PricesService
from broker.service.runtime import Runtime, config_notes, new_job_id
from broker.service.tenants import TenantsService


class Lockstep(OffersService, JobsService, LogsService, NodesService, PricesService, TenantsService,
               EventsService, PlanningService, OperationsService):
    """Every operation of the service over one store and one market; see the module doc for the map."""


__all__ = ["Lockstep", "Runtime", "config_notes", "new_job_id"]
