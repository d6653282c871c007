"""Who calls: a ServiceAccount token through TokenReview, its namespace allowed by a
SubjectAccessReview; anything else is no tenant. Reviews cached briefly and boundedly."""

from __future__ import annotations

from typing import Any

from shardops.batchapi.auth import ACCESS_REVIEWS, TOKEN_REVIEWS, Reviewer, Tenant, service_account_of

# token -> the username a TokenReview answers (None: not authenticated)
USERS = {
    "tok-a": "system:serviceaccount:team-a:batch",
    "tok-b": "system:serviceaccount:team-b:batch",
    "tok-person": "alice@example.com",
}
ALLOWED = {"team-a"}


class FakeApi:
    """The two review endpoints of an API server, with the calls they got."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((path, body))
        if path == TOKEN_REVIEWS:
            user = USERS.get(body["spec"]["token"])
            if user is None:
                return {"status": {"authenticated": False, "error": "invalid bearer token"}}
            return {
                "status": {"authenticated": True, "user": {"username": user, "uid": "u1", "groups": ["g"]}}
            }
        assert path == ACCESS_REVIEWS
        attributes = body["spec"]["resourceAttributes"]
        assert (attributes["verb"], attributes["resource"], attributes["group"]) == (
            "create",
            "campaigns",
            "shardops.dev",
        )
        assert body["spec"]["groups"] == ["g"] and body["spec"]["uid"] == "u1"
        return {"status": {"allowed": attributes["namespace"] in ALLOWED}}


def test_a_service_account_token_allowed_in_its_namespace_is_that_namespaces_tenant() -> None:
    api = FakeApi()
    assert Reviewer(api.post).tenant("tok-a") == Tenant("team-a", "batch")
    assert [path for path, _ in api.calls] == [TOKEN_REVIEWS, ACCESS_REVIEWS]
    assert api.calls[1][1]["spec"]["user"] == "system:serviceaccount:team-a:batch"


def test_no_tenant_for_a_bad_token_a_person_or_a_namespace_rbac_does_not_allow() -> None:
    api = FakeApi()
    reviewer = Reviewer(api.post)
    assert reviewer.tenant("forged") is None
    assert reviewer.tenant("tok-person") is None  # only a ServiceAccount names a namespace
    assert reviewer.tenant("tok-b") is None  # may not create campaigns in team-b
    assert service_account_of("system:serviceaccount:team-a") is None


def test_reviews_are_reused_until_they_expire_and_the_cache_is_bounded() -> None:
    api, now = FakeApi(), [0.0]
    reviewer = Reviewer(api.post, ttl_seconds=30, max_entries=2, clock=lambda: now[0])
    reviewer.tenant("tok-a")
    reviewer.tenant("tok-a")
    assert len(api.calls) == 2  # one TokenReview and one SubjectAccessReview, then cached
    now[0] = 31
    reviewer.tenant("tok-a")
    assert len(api.calls) == 4  # expired: reviewed again (a revoked binding takes effect)
    reviewer.tenant("tok-b")
    reviewer.tenant("forged")
    assert len(reviewer._cache) == 2
    assert not any("tok-" in key for key in reviewer._cache)  # tokens are never kept, only digests
