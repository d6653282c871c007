"""The OpenAI Batch API served by shardops (`shardops batch-api`, the chart's optional batchAPI
service): OpenAI's Files and Batches endpoints backed by Campaigns of a namespace. The modules,
lowest first:

    objects.py   OpenAI objects from Campaigns and stored files, ids, pagination, errors,
                 and the Campaign a batch is                                             [pure]
    auth.py      who calls: a bearer ServiceAccount token through TokenReview, its namespace
                 allowed through a SubjectAccessReview; reviews cached briefly, bounded
    files.py     an uploaded file checked line by line into a bounded spool, then to the namespace's
                 S3 area; input, output and error files streamed back in pages of lines
    app.py       the aiohttp routes: thin handlers, every blocking call on a sized executor
    main.py      `shardops batch-api`: settings from the environment, the clients, the server
"""
