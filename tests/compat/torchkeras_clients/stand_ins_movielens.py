"""A stand-in for the book's ``eat_pytorch_datasets/ml_1m/train.csv`` and ``test.csv`` (chapters
7-7 DIN and 7-8 DIEN), which are a download.

Those files come from MovieLens-1M, prepared as in the chapters' reference code
(GitHub-HongweiZhang/prediction-flow, ``examples/movielens/prepare_data.py``): one row per user,
the user's last rating, with the ids of the user's (up to) 10 latest highly rated movies before
it (``histHighRatedMovieIds``, ``"|"``-joined, oldest first), as many movies the user did not
rate (``negHistMovieIds``), the user's and the movie's columns, and ``label`` = rating >= 4.
The stand-in writes the same columns with the same types and value ranges: ids as integers,
``gender`` ``M``/``F``, the 7 age buckets, 21 occupations, zip codes as text (a few ZIP+4),
``genres`` from MovieLens's 18, ``"|"``-joined; a catalogue of fewer movies.

The signal, seeded: each user likes two genres, and most movies in their history are of those
genres; the last movie is more likely liked when its first genre is one of them (the candidate
against the history: what DIN's attention and DIEN's interest GRUs are for), and some movies
are liked more than others (what the candidate's embedding can learn alone).
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd

GENRES = [
    "Action",
    "Adventure",
    "Animation",
    "Children's",
    "Comedy",
    "Crime",
    "Documentary",
    "Drama",
    "Fantasy",
    "Film-Noir",
    "Horror",
    "Musical",
    "Mystery",
    "Romance",
    "Sci-Fi",
    "Thriller",
    "War",
    "Western",
]
AGES = [1, 18, 25, 35, 45, 50, 56]
HISTORY_LENGTH = 10  # prepare_data.py's max_len


def movielens_like_tables(
    train_users: int = 2400,
    test_users: int = 640,
    movies: int = 40,
    main_genres: int = 6,
    match_effect: float = 3.0,
    popularity_effect: float = 1.5,
    seed: int = 0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(train, test)``: one row per user (different users in each), MovieLens-1M's layout.

    A movie's first genre is one of ``main_genres``; the label's log-odds are ``match_effect``
    when that genre is one the user likes (else 0), centred, plus the movie's popularity
    (normal, standard deviation ``popularity_effect``)."""
    rng = np.random.default_rng(seed)
    movie_ids = np.sort(rng.choice(np.arange(1, 3953), size=movies, replace=False))
    first_genre = rng.choice(len(GENRES), size=main_genres, replace=False)[rng.integers(0, main_genres, size=movies)]
    movie_genres = []
    for genre in first_genre:
        more = rng.choice(len(GENRES), size=min(rng.poisson(0.8), 5), replace=False)
        movie_genres.append("|".join(GENRES[g] for g in dict.fromkeys([genre, *more])))
    popularity = popularity_effect * rng.standard_normal(movies)
    titles = [f"Movie {i} ({rng.integers(1919, 2001)})" for i in movie_ids]
    zip_codes = [f"{z:05d}" for z in rng.integers(1000, 99999, size=150)]
    zip_codes[::15] = [z + "-" + f"{rng.integers(0, 9999):04d}" for z in zip_codes[::15]]

    def table(users: int, first_user_id: int) -> pd.DataFrame:
        rows = []
        for user in range(users):
            liked = rng.choice(np.unique(first_genre), size=2, replace=False)
            liked_movies = np.flatnonzero(np.isin(first_genre, liked))
            others = np.flatnonzero(~np.isin(first_genre, liked))
            length = HISTORY_LENGTH if rng.random() < 0.7 else int(rng.integers(1, HISTORY_LENGTH))
            n_liked = min(int(rng.binomial(length, 0.8)), len(liked_movies))
            history = np.concatenate(
                [
                    rng.choice(liked_movies, size=n_liked, replace=False),
                    rng.choice(others, size=length - n_liked, replace=False),
                ]
            )
            rng.shuffle(history)  # distinct movies: a user rates each once
            negatives = rng.choice(np.setdiff1d(np.arange(movies), history), size=length, replace=False)
            target = rng.choice(liked_movies) if rng.random() < 0.5 else int(rng.integers(0, movies))
            logit = match_effect * (first_genre[target] in liked) - match_effect / 2 + popularity[target]
            likes = rng.random() < 1 / (1 + np.exp(-logit))
            rows.append(
                {
                    "userId": first_user_id + user,
                    "movieId": int(movie_ids[target]),
                    "ratting": int(rng.integers(4, 6) if likes else rng.integers(1, 4)),  # prepare_data.py's spelling
                    "timestamp": int(956703932 + rng.integers(0, 90_000_000)),
                    "last": 1.0,
                    "histHighRatedMovieIds": "|".join(str(movie_ids[m]) for m in history),
                    "negHistMovieIds": "|".join(str(movie_ids[m]) for m in negatives),
                    "gender": "M" if rng.random() < 0.72 else "F",
                    "age": int(rng.choice(AGES)),
                    "occupation": int(rng.integers(0, 21)),
                    "zipCode": zip_codes[rng.integers(0, len(zip_codes))],
                    "title": titles[target],
                    "genres": movie_genres[target],
                    "label": int(likes),
                }
            )
        return pd.DataFrame(rows)

    return table(train_users, 1), table(test_users, 1 + train_users)


def write_ml_1m(folder: str = "./eat_pytorch_datasets/ml_1m", **options: float) -> None:
    """Writes ``train.csv`` and ``test.csv`` where the chapters read them."""
    os.makedirs(folder, exist_ok=True)
    train, test = movielens_like_tables(**options)
    train.to_csv(os.path.join(folder, "train.csv"), index=False)
    test.to_csv(os.path.join(folder, "test.csv"), index=False)
