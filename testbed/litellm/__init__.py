"""The LiteLLM proxy as a test upstream: an OpenAI-compatible server no one here wrote, with a mocked
model that answers without any network. Lowest first:

    versions.env   the pinned LiteLLM version, and why
    proxy-requirements.txt  what its proxy needs besides litellm
    install.sh     installs it once into a venv of its own under ~/.cache/shardops (`make litellm`)
    proxy.py       installed() and litellm_proxy(): the proxy on a free loopback port, its config
"""
