"""`kubectl campaign`, the kubectl plugin (console script kubectl-campaign). The modules, lowest first:

text.py                 tables, durations, relative times every view shares
command.py              what a command is handed: flags, a client made on first use, streams
campaign_client.py      every read and write through k8s.api.Kube, errors turned into exit codes
campaign_summary.py     what status, plan and report show alike (shards in order, counts, budget)
campaign_list.py        list: every campaign of a namespace at a glance
campaign_status.py      status [--watch]: where a campaign is right now
campaign_plan.py        plan: the dry run of the scheduler's next pass and what limits it
campaign_events.py      events: one shard's life
campaign_report.py      report: the closing report and checklist
campaign_results.py     results: every finished item's result in item order, as JSONL
campaign_apply.py       apply -f --items: start a campaign from a local JSONL file
campaign_actions.py     suspend, resume, retry, cancel: the recorded actions
campaign_purge.py       purge: delete a campaign and every result it stored
campaign_completion.py  shell completion (completion bash|zsh, kubectl_complete-campaign)
campaign.py             the parser and the dispatch to the commands above, --version
"""
